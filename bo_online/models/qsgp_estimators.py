"""Moved to :mod:`bo_online.models.qsgp.estimators`; kept so old imports and saved run configs
work."""

from bo_online.models.qsgp.estimators import (  # noqa: F401
    IndexSample,
    control_variate,
    control_variate_gradient_variance,
    exact_terms,
    expected_log_lik,
    linear_phi_estimate,
    prop2_estimate,
    quad_phi_estimate,
    quad_prior_estimate,
    sample_indices,
    theorem1_estimate,
    theorem2_estimate,
    theorem3_estimate,
)
