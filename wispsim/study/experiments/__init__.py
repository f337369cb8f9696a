"""The paper's evaluation as declarative studies (``experiments/*.yaml``) and their report."""
