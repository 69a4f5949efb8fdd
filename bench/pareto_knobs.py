"""The relaxation strengths both Pareto sweeps visit (bench/pareto.py, 200 images
per point, and bench/pareto_sampled.py, 2,000 through the sampler), so their
points stay comparable."""

DELTAS = (1.5, 2.0, 3.0, 4.0, 6.0)  # COOL-SD delta and UniformRelaxed omega
LANTERN_LAMS = (1.5, 2.0, 3.0, 5.0, 8.0)  # LANTERN++ lambda
CSD_LAMS = (0.02, 0.05, 0.1, 0.2)  # CSD lambda (nats)
