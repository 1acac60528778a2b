"""The PyTorch workload of tests/gpu/check.sh: kernel launches the CUDA probes must see.

Initialises CUDA (which loads libcuda.so.1), prints "ready", waits for "go" on stdin, then:
  1. eager: STEPS steps of a matmul, a relu and a sum, each ended by .item() (a device-to-host
     copy and a synchronisation, like an engine's step);
  2. graph: a CUDA graph of the same work captured once and replayed REPLAYS times, each
     replay followed by torch.cuda.synchronize();
  3. triton: a Triton kernel launched TRITON times, if Triton is installed;
  4. timing: LAUNCHES tiny launches (x.add_(1)) then one synchronize, timed on the CPU.
Prints one JSON line with what it did and the timing.
"""
import json
import sys
import time

import torch

STEPS, REPLAYS, TRITON, LAUNCHES = 50, 50, 20, 20000

assert torch.cuda.is_available(), "no CUDA device visible to PyTorch"
device = torch.device("cuda")
a = torch.randn(512, 512, device=device)
b = torch.randn(512, 512, device=device)
torch.cuda.synchronize()
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(0)

done = {"steps": STEPS, "replays": 0, "triton": 0}
for _ in range(STEPS):
    (a @ b).relu().sum().item()

static_out = torch.empty(512, 512, device=device)
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    for _ in range(3):  # warm-up on a side stream, as PyTorch asks before capture
        static_out.copy_((a @ b).relu())
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_out.copy_((a @ b).relu())
for _ in range(REPLAYS):
    graph.replay()
    torch.cuda.synchronize()
done["replays"] = REPLAYS

try:
    import triton
    import triton.language as tl

    @triton.jit
    def infertrace_check_add(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)

    x = torch.zeros(4096, device=device)
    for _ in range(TRITON):
        infertrace_check_add[(4,)](x, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    done["triton"] = TRITON
except ImportError:
    pass
except Exception as e:  # a Triton that cannot compile here: the rest of the check still runs
    done["triton_error"] = f"{type(e).__name__}: {e}"[:300]

x = torch.zeros(1, device=device)
torch.cuda.synchronize()
start = time.perf_counter_ns()
for _ in range(LAUNCHES):
    x.add_(1)
launch_ns = (time.perf_counter_ns() - start) / LAUNCHES
torch.cuda.synchronize()
done.update(launches=LAUNCHES, launch_ns=launch_ns, device=torch.cuda.get_device_name())
print(json.dumps(done), flush=True)
