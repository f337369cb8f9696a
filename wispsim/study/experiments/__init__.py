"""The paper's evaluation as declarative studies (``experiments/*.yaml``) and their report."""

from wispsim.study.experiments.spec import list_experiments, load_spec, resolve, run_experiment, write_report

__all__ = ["list_experiments", "load_spec", "resolve", "run_experiment", "write_report"]
