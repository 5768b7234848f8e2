"""Helpers shared by the test suites: one home each for waiting (`waits`), writing a
job's input files (`inputs`) and running ``spark-submit`` (`submit`)."""
