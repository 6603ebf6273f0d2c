"""Host-layer tests on the CPU: the cached launch plans of gemm()/linear() must hand the
kernel exactly what the validated path does. The compiled kernel is replaced by a
recorder that computes the reference, so this runs without a GPU."""

from __future__ import annotations

import pytest
import torch

import importlib

from cute_kernels.gemm.reference import linear_ref

api = importlib.import_module("cute_kernels.gemm.api")  # (cute_kernels.gemm is also the op)


@pytest.fixture
def fake_kernels(monkeypatch):
    calls = []

    def get_kernel(kernel_name, a_dt, b_dt, c_dt, a_major, b_major, cfg, epi, acc_name="Float32"):
        def fn(a, b_nk, out, bias, residual, row_scale, col_scale, alpha, beta):
            calls.append(dict(a=a, b=b_nk, out=out, bias=bias, residual=residual, alpha=alpha, beta=beta, epi=epi))
            y = linear_ref(a.float(), b_nk.float(), None if bias is None else bias.float(),
                           activation=None if epi.activation == "none" else epi.activation,
                           residual=None if residual is None else residual.float(),
                           alpha=alpha if epi.alpha else 1.0, beta=beta if epi.beta else 1.0)
            out.copy_(y.to(out.dtype))
        return fn

    monkeypatch.setattr(api, "get_kernel", get_kernel)
    monkeypatch.setattr(api, "check_device", lambda t, what="tensor": 132)
    api._LINEAR_PLANS.clear()
    api._GEMM_PLANS.clear()
    return calls


@pytest.mark.parametrize("N", [768, 50257])
@pytest.mark.parametrize("with_residual", [False, True])
def test_linear_hot_path_matches_first_call(fake_kernels, N, with_residual):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(N, 64, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.bfloat16)
    res = torch.randn(2, 5, N, dtype=torch.bfloat16) if with_residual else None
    outs = [api.linear(x, w, b, activation="gelu_tanh", residual=res, alpha=0.5, beta=2.0) for _ in range(3)]
    assert len(api._LINEAR_PLANS) == 1, "the launch plan was not recorded"
    assert len(fake_kernels) == 3
    first, later = fake_kernels[0], fake_kernels[2]
    for k in ("a", "b", "bias", "residual"):
        if first[k] is None:
            assert later[k] is None
        else:
            assert later[k].shape == first[k].shape and later[k].stride() == first[k].stride()
            assert later[k].data_ptr() == first[k].data_ptr()
    assert later["out"].shape == first["out"].shape and later["out"].stride() == first["out"].stride()
    assert (later["alpha"], later["beta"]) == (0.5, 2.0)
    ref = linear_ref(x, w, b, activation="gelu_tanh", residual=res, alpha=0.5, beta=2.0)
    for o in outs:
        assert o.shape == (2, 5, N)
        torch.testing.assert_close(o.float(), ref.float(), atol=0.1, rtol=0.02)


def test_linear_no_plan_when_a_copy_was_needed(fake_kernels):
    x = torch.randn(4, 130, dtype=torch.bfloat16)[:, 1:129]  # misaligned base -> padded copy
    w = torch.randn(32, 128, dtype=torch.bfloat16)
    api.linear(x, w)
    assert not api._LINEAR_PLANS
    api.linear(x.contiguous(), w)
    assert len(api._LINEAR_PLANS) == 1


def test_linear_hot_path_rechecks_alignment(fake_kernels):
    w = torch.randn(32, 128, dtype=torch.bfloat16)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    api.linear(x, w)
    buf = torch.randn(3 * 128 + 8, dtype=torch.bfloat16)
    x_mis = buf[1:1 + 3 * 128].view(3, 128)  # same signature, 2-byte-misaligned data
    out = api.linear(x_mis, w)
    assert fake_kernels[-1]["a"].data_ptr() % 16 == 0  # went through the copying path
    torch.testing.assert_close(out.float(), (x_mis.float() @ w.float().t()), atol=0.1, rtol=0.02)


def test_gemm_hot_path(fake_kernels):
    a = torch.randn(33, 64, dtype=torch.bfloat16)
    b = torch.randn(50, 64, dtype=torch.bfloat16).t()
    o1, o2 = api.gemm(a, b), api.gemm(a, b)
    assert len(api._GEMM_PLANS) == 1 and len(fake_kernels) == 2
    torch.testing.assert_close(o1, o2)
    assert o2.shape == (33, 50) and o2.stride(0) == 56  # N padded to a multiple of 8
