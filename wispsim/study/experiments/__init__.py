"""The paper's evaluation as declarative, runnable studies (SPEC 7).

One YAML file per study under ``experiments/`` names its ``study`` kind, its parameters, and a
``quick`` block of overrides for a reduced run (:mod:`.spec`). ``wispsim experiment run NAME`` (or
``--all``) runs it (:mod:`.run`): data and figures go to ``experiments/data/NAME/``
(``experiments/quick/NAME/`` with ``--quick``), and each study writes a markdown section;
``experiments/REPORT.md`` (``experiments/quick/REPORT.md``) is regenerated from every section
present, in the order of the studies' ``order`` keys. Every section says what was run (scenario,
seeds, versions, wall time) and what it shows; a study's ``discussion`` field (written by a
person, after looking at the numbers) is printed under its tables, with a caution when the tables
no longer hash to its ``discussion_for`` (the numbers it was written for).

The study kinds: capacity, mix, acceptance and estimator (:mod:`.capacity_studies`; capacity
searches resume from stored points, and the section header says which git commit computed the
points it shows), bursty, ablation and attribution (:mod:`.run_studies`; whole runs, simulated
again on a rerun), requests (:mod:`.requests_study`: production request traces per replica
count), round-cost (:mod:`.round_cost_study`: vLLM's cost of a verification round by its
parts), decision (:mod:`.decision_study`: capacity per target x class x policy and verifier build,
what binds, sensitivity bands, what it costs), paper (:mod:`.paper_study`: the WISP paper's tables
beside ours per candidate baseline), regimes (:mod:`.regimes_study`: where SLO-aware batching and the
predictor pay). Their figures are drawn by :mod:`wispsim.plots`.
"""

# Importing the study modules registers their kinds in STUDIES (spec.py checks names against it).
from wispsim.study.experiments import (  # noqa: F401
    capacity_studies,
    decision_study,
    heldout_study,
    paper_study,
    public_sd_study,
    public_study,
    regimes_study,
    requests_study,
    round_cost_study,
    run_studies,
    validation_scale_study,
    validation_study,
)
from wispsim.study.experiments.run import refresh_discussion, run_experiment, write_report
from wispsim.study.experiments.spec import list_experiments, load_spec, resolve

__all__ = ["list_experiments", "load_spec", "refresh_discussion", "resolve", "run_experiment", "write_report"]
