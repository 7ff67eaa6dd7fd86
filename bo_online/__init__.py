"""bo_online: Bayesian optimisation and active learning with online GP surrogates.

Surrogates fold new observations in at a cost that does not grow with the data already seen;
each is a BoTorch model, so BoTorch acquisition functions, ``optimize_acqf`` and Ax work unchanged.
"""

__version__ = "0.1.0"
