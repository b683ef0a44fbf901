"""Prefect task runs on Ray, faster than prefect-ray's own runner, and the run's Prefect API
server; each speed-up builds on Prefect or prefect-ray internals."""
