"""A real GPU in a sandbox: opt-in, for a host with an NVIDIA GPU and the NVIDIA Container Toolkit.

Skipped unless ``AGENTNEST_GPU_TESTS=1``::

    AGENTNEST_GPU_TESTS=1 .venv/bin/pytest -q tests/integration/test_gpu_real.py
    # another image (it needs python3; the toolkit injects the driver's libraries):
    AGENTNEST_GPU_TESTS=1 AGENTNEST_GPU_IMAGE=python:3.12-slim \
        .venv/bin/pytest -q tests/integration/test_gpu_real.py

It runs ``nvidia-smi -L`` inside ``gpu_sandbox(...)``, then a CUDA program
that needs no CUDA toolkit in the image: Python's ctypes against
``libcuda.so.1`` (the driver API, injected by the toolkit), loading a
hand-written PTX vector-add kernel, launching it and checking every sum.
Under gVisor it runs only where runsc has nvproxy on (see docs/presets.md).

Never run on the machines that build AgentNest (they have no GPU): what is
verified there is the request building, the refusal and doctor's lines
(tests/unit/test_gpus_docker.py, tests/integration/test_presets_engine.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from agentnest import Sandbox
from agentnest.presets import gpu_sandbox
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.registry import get_backend

from .helpers import owned_containers

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.environ.get("AGENTNEST_GPU_TESTS") != "1",
        reason="a real GPU is needed: set AGENTNEST_GPU_TESTS=1 on a host with one (docs/presets.md)",
    ),
]

#: The driver API through ctypes: init, count, a context, a PTX module, a
#: launch of c[i] = a[i] + b[i] over N floats, and the check of every sum.
CUDA_VECTOR_ADD = r'''
import ctypes, json, sys

PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 pn)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<11>;

    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r2, [pn];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.s32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd4, %rd1;
    cvta.to.global.u64 %rd5, %rd2;
    cvta.to.global.u64 %rd6, %rd3;
    mul.wide.s32 %rd7, %r1, 4;
    add.s64 %rd8, %rd4, %rd7;
    add.s64 %rd9, %rd5, %rd7;
    add.s64 %rd10, %rd6, %rd7;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}
"""

cuda = ctypes.CDLL("libcuda.so.1")
u64, size_t, vp, uint = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint
cuda.cuCtxCreate_v2.argtypes = [ctypes.POINTER(vp), uint, ctypes.c_int]
cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size_t]
cuda.cuMemcpyHtoD_v2.argtypes = [u64, vp, size_t]
cuda.cuMemcpyDtoH_v2.argtypes = [vp, u64, size_t]
cuda.cuLaunchKernel.argtypes = [
    vp, uint, uint, uint, uint, uint, uint, uint, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)
]


def ck(result, what):
    if result != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(result, ctypes.byref(name))
        sys.exit(f"{what} failed: CUresult {result} {name.value!r}")


ck(cuda.cuInit(0), "cuInit")
count = ctypes.c_int()
ck(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
device = ctypes.c_int()
ck(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
context = vp()
ck(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device.value), "cuCtxCreate")
module = vp()
ck(cuda.cuModuleLoadData(ctypes.byref(module), PTX), "cuModuleLoadData")
kernel = vp()
ck(cuda.cuModuleGetFunction(ctypes.byref(kernel), module, b"vadd"), "cuModuleGetFunction")

n = 100_000
size = n * 4
a = (ctypes.c_float * n)(*[float(i) for i in range(n)])
b = (ctypes.c_float * n)(*[0.5 * i for i in range(n)])
c = (ctypes.c_float * n)()
da, db, dc = u64(), u64(), u64()
for ptr in (da, db, dc):
    ck(cuda.cuMemAlloc_v2(ctypes.byref(ptr), size), "cuMemAlloc")
ck(cuda.cuMemcpyHtoD_v2(da, ctypes.cast(a, vp), size), "cuMemcpyHtoD")
ck(cuda.cuMemcpyHtoD_v2(db, ctypes.cast(b, vp), size), "cuMemcpyHtoD")
nn = ctypes.c_uint(n)
params = (vp * 4)(*[ctypes.cast(ctypes.byref(x), vp) for x in (da, db, dc, nn)])
block = 256
grid = (n + block - 1) // block
ck(cuda.cuLaunchKernel(kernel, grid, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")
ck(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
ck(cuda.cuMemcpyDtoH_v2(ctypes.cast(c, vp), dc, size), "cuMemcpyDtoH")
wrong = [i for i in range(n) if c[i] != a[i] + b[i]]
name = ctypes.create_string_buffer(256)
cuda.cuDeviceGetName(name, 256, device.value)
print(json.dumps({
    "devices": count.value, "name": name.value.decode(), "n": n, "wrong": wrong[:10], "c_last": c[n - 1]
}))
'''


def _backends() -> list[Any]:
    return [pytest.param("docker", id="runc"), pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc")]


@pytest.fixture(params=_backends())
def gpu_backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    backend = get_backend(name)
    assert isinstance(backend, DockerBackend)
    support = backend.gpu_support()
    if name == "gvisor" and not support.nvproxy:
        pytest.skip(f"gVisor's nvproxy is opt-in and off here: {support.fix}")
    # On runc the host must give GPUs: that is what the opt-in says.
    assert support.available, f"AGENTNEST_GPU_TESTS=1 but {support.reason}; {support.fix}"
    return name


def test_nvidia_smi_and_a_cuda_kernel_in_a_gpu_sandbox(docker_client: Any, gpu_backend: str) -> None:
    before = owned_containers(docker_client)
    sandbox: Sandbox = gpu_sandbox(
        os.environ.get("AGENTNEST_GPU_IMAGE"),
        gpus=1,
        backend=gpu_backend,
        memory="4g",
        # compute for libcuda, utility for nvidia-smi: what the toolkit injects.
        environment={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    )
    with sandbox:
        listed = sandbox.exec_shell("nvidia-smi -L", timeout=120)
        assert listed.exit_code == 0, listed.stderr
        gpu_lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        assert len(gpu_lines) == 1 and "UUID: GPU-" in gpu_lines[0], listed.stdout  # gpus=1: one, not all
        seen = sandbox.exec_json(CUDA_VECTOR_ADD, timeout=300)
        assert isinstance(seen, dict), seen
        assert seen["devices"] == 1 and seen["name"]
        assert seen["wrong"] == [] and seen["c_last"] == 1.5 * (seen["n"] - 1)
    assert owned_containers(docker_client) == before
