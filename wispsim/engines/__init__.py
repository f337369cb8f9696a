"""Real inference engines behind one interface (HF transformers, vLLM). torch is imported lazily."""
