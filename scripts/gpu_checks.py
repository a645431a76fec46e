#!/usr/bin/env python3
"""The GPU half of scripts/gpu_check.sh: cuda and python_gpu runs through /run_code of a server started with
`--gpus all --runs-per-gpu 2`, each checked against an answer computed here.

Checks: a CUDA kernel's result (fresh random inputs per run); a PyTorch matmul on the GPU against float64 on the
CPU, with the run's view of /dev; nvcc's message for code that does not compile; two runs that hold GPU memory and
spin a kernel past their time-out (killed, the slots and the memory free again) while a third finds no slot within
its time-out; a run that reads another live GPU run's memory (must fault or read nothing of it), the next run on
that GPU succeeding, and fresh memory holding nothing of an ended run; the latency of cuda and python_gpu runs.
Writes gpu_checks.json to --output-dir; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import requests

PREAMBLE = r"""
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>
#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("ERR %s %s\n", cudaGetErrorName(e_), cudaGetErrorString(e_)); return 3; } } while (0)
"""
SAXPY = PREAMBLE + r"""
__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
int main() {
  int a, k; if (scanf("%d %d", &a, &k) != 2) return 4;
  const int n = 1 << 20;
  float *x, *y, *hx = (float*)malloc(n * 4), *hy = (float*)malloc(n * 4);
  for (int i = 0; i < n; ++i) { hx[i] = (float)((long long)i * k % 1000); hy[i] = 1.0f; }
  CHECK(cudaMalloc(&x, n * 4)); CHECK(cudaMalloc(&y, n * 4));
  CHECK(cudaMemcpy(x, hx, n * 4, cudaMemcpyHostToDevice)); CHECK(cudaMemcpy(y, hy, n * 4, cudaMemcpyHostToDevice));
  for (int i = 0; i < n; ++i) hy[i] = -1.0f;  // poisoned: every element must come back written
  saxpy<<<(n + 255) / 256, 256>>>(n, (float)a, x, y);
  CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(hy, y, n * 4, cudaMemcpyDeviceToHost));
  double sum = 0; int bad = 0;
  for (int i = 0; i < n; ++i) { if (hy[i] != (float)a * hx[i] + 1.0f) ++bad; sum += hy[i]; }
  printf("bad=%d sum=%.0f\n", bad, sum);
  return bad != 0;
}
"""
MEMINFO = PREAMBLE + r"""
int main() {
  size_t free_b, total_b; CHECK(cudaMemGetInfo(&free_b, &total_b));
  printf("free=%zu total=%zu\n", free_b, total_b);
  return 0;
}
"""
HOG = PREAMBLE + r"""
__global__ void spin(unsigned* p) { while (true) { atomicAdd(p, 1u); } }
int main() {
  unsigned* p; CHECK(cudaMalloc(&p, 8ull << 30)); CHECK(cudaMemset(p, 0, 8ull << 30));
  spin<<<132, 256>>>(p); CHECK(cudaGetLastError());
  printf("spinning\n"); fflush(stdout);
  CHECK(cudaDeviceSynchronize());
  return 0;
}
"""
MAGIC = 0x5EC12E7A
HOLDER = PREAMBLE + r"""
__global__ void fill(unsigned* p, size_t n) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] = 0x5EC12E7Au; }
int main() {
  int hold; if (scanf("%d", &hold) != 1) return 4;
  const size_t n = (256u << 20) / 4; unsigned* p; CHECK(cudaMalloc(&p, n * 4));
  fill<<<(n + 255) / 256, 256>>>(p, n); CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  printf("ptr=%llu\n", (unsigned long long)p); fflush(stdout);
  sleep(hold);
  return 0;
}
"""
PROBER = PREAMBLE + r"""
__device__ unsigned seen;
__global__ void peek(const unsigned* p) { seen = *p; }
int main() {
  unsigned long long addr; int wait; if (scanf("%llu %d", &addr, &wait) != 2) return 4;
  CHECK(cudaFree(0));  // the context first, then the wait: the read comes while the holder holds its memory
  sleep(wait);
  peek<<<1, 1>>>((const unsigned*)addr); CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  unsigned v; CHECK(cudaMemcpyFromSymbol(&v, seen, sizeof v));
  printf("read=%u\n", v);
  return 0;
}
"""
SCAN = PREAMBLE + r"""
int main() {
  const size_t n = (512ull << 20) / 4; unsigned* p; CHECK(cudaMalloc(&p, n * 4));
  unsigned* h = (unsigned*)malloc(n * 4); CHECK(cudaMemcpy(h, p, n * 4, cudaMemcpyDeviceToHost));
  size_t hits = 0; for (size_t i = 0; i < n; ++i) hits += h[i] == 0x5EC12E7Au;
  printf("magic=%zu\n", hits);
  return 0;
}
"""
TORCH_MATMUL = r"""
import json, os, torch
torch.backends.cuda.matmul.allow_tf32 = False
a = torch.randn(1024, 1024, device="cuda"); b = torch.randn(1024, 1024, device="cuda")
c = a @ b
ref = a.double().cpu() @ b.double().cpu()
print(json.dumps({"device": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                  "rel_err": ((c.double().cpu() - ref).norm() / ref.norm()).item(), "dev": sorted(os.listdir("/dev")),
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""
TORCH_SMALL = "import torch\nx = torch.ones(256, device='cuda')\nprint(int((x @ x).item()))\n"
DEV_ALLOWED = {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin", "stdout",
               "stderr", "core", "nvidiactl", "nvidia-uvm"}


class Checks:
    def __init__(self, url: str):
        self.url = url.rstrip("/") + "/run_code"
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, language: str, code: str, stdin: str = "", run_timeout: float = 30.0) -> dict[str, Any]:
        started = time.perf_counter()
        response = requests.post(self.url, json={"code": code, "language": language, "stdin": stdin,
                                                 "run_timeout": run_timeout, "compile_timeout": 60}, timeout=300)
        response.raise_for_status()
        answer = response.json()
        answer["client_s"] = time.perf_counter() - started
        return answer

    def record(self, name: str, ok: bool, **details: Any) -> None:
        self.results[name] = {"ok": bool(ok), **details}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(details, default=str)[:600]}", flush=True)

    def saxpy(self) -> dict[str, Any]:
        a, k = random.randint(2, 9), random.randint(3, 997)
        n = 1 << 20
        want = sum(a * ((i * k) % 1000) + 1 for i in range(n))
        answer = self.run("cuda", SAXPY, f"{a} {k}\n")
        out = (answer.get("run_result") or {}).get("stdout", "")
        answer["ok"] = answer["status"] == "Success" and out.strip() == f"bad=0 sum={want}"
        return answer

    def free_memory(self) -> int:
        answer = self.run("cuda", MEMINFO)
        out = (answer.get("run_result") or {}).get("stdout", "")
        return int(out.split("free=")[1].split()[0]) if "free=" in out else -1

    def all(self) -> None:
        checks = [self.check_kernel, self.check_torch, self.check_compile_error, self.check_hogs,
                  self.check_memory_isolation, self.check_latency]
        for check in checks:
            try:
                check()
            except Exception as exc:  # one broken check must not hide the others' results
                self.record(check.__name__, False, error=repr(exc))

    def check_kernel(self) -> None:
        answer = self.saxpy()
        self.record("cuda_kernel_result", answer["ok"], status=answer["status"], message=answer.get("message"),
                    compile=answer.get("compile_result"), run=answer.get("run_result"))

    def check_torch(self) -> None:
        answer = self.run("python_gpu", TORCH_MATMUL, run_timeout=60)
        run = answer.get("run_result") or {}
        try:
            info = json.loads(run.get("stdout", ""))
        except ValueError:
            info = {}
        extra = sorted(set(info.get("dev", [])) - DEV_ALLOWED - {f"nvidia{i}" for i in range(64)})
        nodes = [d for d in info.get("dev", []) if d.startswith("nvidia")]
        self.record("python_gpu_torch_matmul", answer["status"] == "Success" and info.get("rel_err", 1) < 1e-5,
                    status=answer["status"], info=info, stderr=run.get("stderr", "")[-1500:])
        self.record("gpu_run_sees_only_its_devices", bool(info) and not extra and len(nodes) <= 3,
                    extra_dev=extra, nvidia_nodes=nodes, cuda_visible=info.get("visible"))

    def check_compile_error(self) -> None:
        answer = self.run("cuda", "__global__ void k() { undeclared_name = 1; }\nint main() { return 0; }\n")
        compiled = answer.get("compile_result") or {}
        self.record("cuda_compile_error", answer["status"] == "Failed" and compiled.get("return_code") not in (0, None)
                    and "undeclared_name" in compiled.get("stderr", "") and not answer.get("run_result"),
                    status=answer["status"], stderr=compiled.get("stderr", "")[-600:])

    def check_hogs(self) -> None:
        before = self.free_memory()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            hogs = [pool.submit(self.run, "cuda", HOG, "", 5.0) for _ in range(2)]
            time.sleep(1.0)  # both hogs hold the two slots (a slot is taken before the compile)
            third = pool.submit(self.run, "python_gpu", "print(1)", "", 2.0).result()
            hog_answers = [hog.result() for hog in hogs]
        released = time.perf_counter()
        after = self.free_memory()
        freed_after_s = time.perf_counter() - released
        statuses = [(h["status"], (h.get("run_result") or {}).get("status")) for h in hog_answers]
        self.record("hog_killed_at_timeout", all(s == ("Failed", "TimeLimitExceeded") for s in statuses),
                    statuses=statuses, times=[(h.get("run_result") or {}).get("execution_time") for h in hog_answers],
                    stdout=[(h.get("run_result") or {}).get("stdout", "")[:100] for h in hog_answers])
        self.record("no_free_slot_is_sandbox_error", third["status"] == "SandboxError"
                    and "no GPU slot came free" in third.get("message", ""), status=third["status"],
                    message=third.get("message"), waited_s=third["client_s"])
        self.record("slot_and_memory_free_after_kill", before > 0 and after >= before - (512 << 20),
                    free_before=before, free_after=after, next_run_s=freed_after_s)

    def check_memory_isolation(self) -> None:
        layout = self.run("cuda", HOLDER, "0\n")
        pointer = int((layout.get("run_result") or {}).get("stdout", "ptr=0").split("ptr=")[1].split()[0])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            holder = pool.submit(self.run, "cuda", HOLDER, "10\n")
            time.sleep(0.5)
            prober = pool.submit(self.run, "cuda", PROBER, f"{pointer} 5\n").result()
            held = holder.result()
        held_out = (held.get("run_result") or {}).get("stdout", "")
        probe = prober.get("run_result") or {}
        out = probe.get("stdout", "")
        read_magic = out.strip() == f"read={MAGIC}"
        faulted = prober["status"] == "Failed" and "ERR" in out
        # A run's device addresses differ from one process to the next: the prober aims at where an earlier
        # holder had its buffer; what matters is that it never reads the live holder's data.
        self.record("read_of_another_runs_memory_fails", held["status"] == "Success" and not read_magic
                    and (faulted or out.startswith("read=")), target=pointer, holder=held_out.strip(),
                    holder_status=held["status"], prober_status=prober["status"], prober=out.strip(),
                    prober_stderr=probe.get("stderr", "")[-300:], faulted=faulted)
        after_crash = self.saxpy()
        self.record("next_run_after_a_crash_succeeds", after_crash["ok"], status=after_crash["status"],
                    run=after_crash.get("run_result"))
        scan = self.run("cuda", SCAN, run_timeout=60)
        scanned = (scan.get("run_result") or {}).get("stdout", "")
        self.record("fresh_memory_holds_nothing_of_an_ended_run", scanned.strip() == "magic=0", scan=scanned.strip(),
                    status=scan["status"], message=scan.get("message"),
                    stderr=(scan.get("run_result") or {}).get("stderr", "")[-300:])

    def check_latency(self) -> None:
        rows: dict[str, list[dict[str, float]]] = {"cuda": [], "python_gpu": []}
        for _ in range(5):
            answer = self.saxpy()
            rows["cuda"].append({"client_s": answer["client_s"],
                                 "compile_s": (answer.get("compile_result") or {}).get("execution_time") or 0.0,
                                 "run_s": (answer.get("run_result") or {}).get("execution_time") or 0.0,
                                 "ok": answer["ok"]})
            small = self.run("python_gpu", TORCH_SMALL)
            rows["python_gpu"].append({"client_s": small["client_s"],
                                       "run_s": (small.get("run_result") or {}).get("execution_time") or 0.0,
                                       "ok": (small.get("run_result") or {}).get("stdout", "").strip() == "256"})
        medians = {language: {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "ok"}
                   for language, runs in rows.items()}
        self.record("latency", all(r["ok"] for runs in rows.values() for r in runs), medians=medians, runs=rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandbox-url", required=True)
    parser.add_argument("--output-dir", default=".")
    args = parser.parse_args()
    checks = Checks(args.sandbox_url)
    checks.all()
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.output_dir) / "gpu_checks.json").write_text(json.dumps(checks.results, indent=1, default=str))
    failed = [name for name, result in checks.results.items() if not result["ok"]]
    print(f"{len(checks.results) - len(failed)}/{len(checks.results)} GPU checks passed" +
          (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
