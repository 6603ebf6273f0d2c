// Python binding of the GEMM ladder: tensor checks, output allocation, launch on
// torch's current stream. The kernels themselves never see torch headers.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>

#include "ladder.h"

namespace {

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, const std::string& rung, bool out_fp32) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "a and b must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16, "a and b must be bfloat16");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "expected a [M, K] and b [K, N]");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "a and b must be row-major contiguous");
    const c10::cuda::CUDAGuard guard(a.device());
    const int M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1)), N = static_cast<int>(b.size(1));
    auto c = torch::empty({M, N}, a.options().dtype(out_fp32 ? at::kFloat : at::kBFloat16));
    if (c.numel() == 0) return c;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    using Launcher = cudaError_t (*)(const void*, const void*, void*, bool, int, int, int, cudaStream_t);
    Launcher launch = nullptr;
    if (rung == "naive") launch = ladder_naive;
    else if (rung == "smem") launch = ladder_smem;
    else if (rung == "regtile") launch = ladder_regtile;
    else if (rung == "wmma") launch = ladder_wmma;
    TORCH_CHECK(launch != nullptr, "unknown rung '", rung, "'");
    const cudaError_t err = launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), out_fp32, M, N, K, stream);
    TORCH_CHECK(err == cudaSuccess, "ladder '", rung, "' launch failed: ", cudaGetErrorString(err));
    return c;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gemm", &gemm, "C = A @ B (bf16 in, fp32 accumulate)", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("rung"), pybind11::arg("out_fp32") = false);
}
