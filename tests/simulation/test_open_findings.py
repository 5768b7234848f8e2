"""Violations the exploration found that are not fixed yet, each repeated by its seed and
index (`explore.random_run`) as a strict xfail: it fails while the finding stands, and
turns into an unexpected pass, failing the run, once a fix lands (then pin its shrunk
schedule in `test_found.py` and remove it here). None is open now: the last one,
20261130:2705, is `test_found.test_a_moved_savepoint_whose_pending_batch_another_lineage_rewound_away`."""
