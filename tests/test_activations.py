"""The activation registry: one list for the ops, the kernels and the transformers mapping."""

import pytest
import torch

from cute_kernels import activations


def test_codes_are_distinct_and_none_is_zero():
    codes = [a.code for a in activations.REGISTRY.values()]
    assert len(set(codes)) == len(codes) and activations.code(None) == 0 == activations.code("none")


@pytest.mark.parametrize("hf_name", sorted(activations.FROM_HF))
def test_hf_names_are_the_same_function(hf_name):
    """Fusing transformers' activation into our epilogue must not change the model's math."""
    from transformers.activations import ACT2FN

    x = torch.randn(4096, dtype=torch.float64) * 4
    torch.testing.assert_close(activations.apply(x, activations.FROM_HF[hf_name]), ACT2FN[hf_name](x),
                               rtol=1e-12, atol=1e-12)


def test_ops_reject_unknown_names():
    with pytest.raises(ValueError, match="activation must be one of"):
        activations.apply(torch.zeros(2), "silu")
