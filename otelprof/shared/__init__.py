"""Per-step judgements the training process and the offline checks make with the same code.

Outlier steps and loss spikes (:mod:`~otelprof.shared.outliers`, on :mod:`~otelprof.shared.sampling`'s detector,
which also picks the steps that become spans), communication time from overlapping intervals
(:mod:`~otelprof.shared.collectives`) and nested regions of one name (:mod:`~otelprof.shared.nesting`): the
recorder runs them live, :mod:`otelprof.analysis` on a recording, so live and offline verdicts agree.

May import: the catalog and configuration modules at the top of ``otelprof`` and :mod:`otelprof.recording`.
"""
