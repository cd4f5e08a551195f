#!/usr/bin/env python3
"""Simulated machines for StarPU 1.4's SimGrid build, from one table of specifications.

MACHINES below is the one place where each machine's numbers live, every number with its
source. For each machine this script writes, under sched/machines/<name>/ (a directory laid
out like StarPU's own sampling directory):

  bus/<name>.platform.v4.xml   the SimGrid platform the simulator runs on
  bus/<name>.bandwidth, .latency, .config, .affinity
                               the bus model StarPU's schedulers predict with
  codelets/45/dos_adam.<name>, dos_cast.<name>, dos_grad_stats.<name>, dos_grad_scale.<name>
                               optimizer codelet perfmodels (CPU and CUDA), from bandwidth models
  codelets/45/dos_linear_fwd.<name>, ... dos_batch.<name>
                               the example model's codelet perfmodels (docs/model.md), from
                               SGEMM rates (sized by floating-point operations) or bandwidth
                               (sized by bytes of data): MODEL_CODELETS
  sim.env                      the worker counts and GPU memory limit tools/sim-env.sh exports

and refreshes the generated tables in sched/machines/README.md. Output is deterministic (no
timestamps), so the generated files are committed and `--check` tells whether they are
current. Formats follow StarPU 1.4.10's writers byte for byte (perfmodel_bus.c,
perfmodel_history.c): see sched/machines/README.md for the pitfalls.

NETWORKS is the same for the networks between simulated nodes: `--cluster N --network NAME
--out DIR` writes DIR/cluster.xml (a SimGrid platform of N nodes on that network) and
DIR/hostfile, which tools/sim-cluster.sh hands to StarPU's starpu_smpirun; each node is
then one of the machines above.

Usage: tools/gen-machine.py [--check] [--out DIR --cpu-workers W] [NAME...]
       tools/gen-machine.py --cluster N [--network NAME] --out DIR
       tools/gen-machine.py --read-calibration DIR   (numbers for the table from a real run)
"""

import argparse
import difflib
import math
import os
import struct
import sys
from dataclasses import dataclass, replace
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "sched", "machines")
README = os.path.join(DEFAULT_OUT, "README.md")

GB = 1e9
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Num:
    """One number of a machine's specification, with where it came from.

    status: "published" (a published measurement), "datasheet", "measured" (by us),
    "derived" (computed from other numbers, formula in source), "estimate", "assumption",
    "choice" (a modelling decision), "unknown" (value None: not used by the simulation)."""

    value: Optional[float]
    unit: str
    status: str
    source: str


@dataclass(frozen=True)
class Machine:
    name: str
    title: str
    gpu_model: str  # the "model" property StarPU shows for CUDA0
    cores: Num  # physical cores of the rank (documentation: the CPU is modelled by bandwidth)
    cpu_workers: Num  # W: simulated CPU workers sharing host_bw (see cpu_model_note)
    host_mem: Num  # bytes (documentation: SimGrid StarPU takes RAM size from the real host)
    host_bw: Num  # B/s: memory bandwidth CPU Adam reaches over all cores, 28 B/param counted
    gpu_mem: Num  # bytes: the CUDA0 "memsize" property and STARPU_LIMIT_CUDA_MEM
    gpu_bw: Num  # B/s: HBM bandwidth the GPU kernels reach, counted like host_bw
    pcie_h2d: Num  # B/s, sustained, host to device
    pcie_d2h: Num  # B/s, sustained, device to host (full duplex: both at once)
    pcie_latency: Num  # s, per transfer
    cpu_task_overhead: Num  # s added to every CPU task (the regression's c)
    gpu_task_overhead: Num  # s added to every CUDA task
    cpu_sgemm_core: Num  # FLOP/s: fp32 SGEMM of one core (single-threaded OpenBLAS, as codelets/model_cpu.c runs it)
    gpu_sgemm: Num  # FLOP/s: fp32 SGEMM of the GPU (cuBLAS, TF32 off)
    gpu_gemm16: Num  # FLOP/s: bf16/fp16 products on the tensor cores, fp32 accumulation (16-bit compute)
    # Several GPUs in one process (left at their defaults for a one-GPU rank): G identical
    # GPUs, each with its own x16 link (pcie_h2d, pcie_d2h); gpus_per_switch of them share
    # one PCIe switch whose uplink to the host (switch_h2d, switch_d2h) they share.
    gpus: Optional[Num] = None  # G; None: one GPU
    sockets: Optional[Num] = None  # documentation: the simulation has one host memory node
    gpus_per_switch: Optional[Num] = None
    switch_h2d: Optional[Num] = None  # B/s, sustained, one switch's uplink, host to switch
    switch_d2h: Optional[Num] = None  # B/s, sustained, switch to host

    def ngpus(self):
        return int(self.gpus.value) if self.gpus else 1

    def switch_of(self, k):
        """The PCIe switch GPU k sits behind (its own one when there are no switches)."""
        return k // int(self.gpus_per_switch.value) if self.gpus_per_switch else k


ADAM_BYTES = 28  # per parameter: read p, m, v (12) + fp16 grad (2); write p, m, v (12) + weight16 (2)

# Task overheads: small next to any subgroup that matters; they keep tiny tasks from
# being free. The CPU value is what StarPU calibrated here for dos_adam (c = 2.5 us in
# /tmp/devout's real calibration of this VM, 2026-11-29).
CPU_OVERHEAD = Num(2e-6, "s", "estimate", "StarPU's fit of dos_adam on the development VM (c = 2.5 us), rounded")
GPU_OVERHEAD = Num(5e-6, "s", "estimate", "CUDA kernel launch plus StarPU's CUDA driver, ~5 us")
PCIE_LATENCY = Num(
    10e-6,
    "s",
    "estimate",
    "StarPU's own bus calibrations measure 9.5-11 us host<->GPU (tools/perfmodels/sampling/bus/sirocco.latency)",
)
ONE_CPU_WORKER = Num(
    1,
    "workers",
    "choice",
    "one simulated CPU worker = all cores updating one subgroup at a time at full host bandwidth, "
    "as DeepSpeed's CPU Adam does; no wave quantisation for any task count",
)


# The example model's products (codelets/model_cpu.c, model_cuda.cu): fp32 SGEMM, OpenBLAS
# made single-threaded on the CPU (StarPU's workers are the parallelism), cuBLAS with its
# default math mode (no TF32) on the GPU.
SGEMM_EFFICIENCY = Num(
    0.7,
    "of peak",
    "assumption",
    "fraction of the FP32 (non-tensor) peak that SGEMM reaches over the model's shapes, CPU and GPU alike: "
    "large square SGEMMs reach 0.75-0.9 of it, the model's thin ones (n = B*T tokens, k = hd in attention) less",
)
ATTENTION_EFFICIENCY = Num(
    0.6,
    "of the SGEMM rate",
    "assumption",
    "the attention codelets' batched SGEMMs (k = hd, or n = hd) plus their memory-bound softmax passes: per score, "
    "4 hd FLOP forward (8 hd backward) against ~16 B (~28 B) of score traffic and a scalar expf on the CPU; "
    "for hd = 128 on the h100-pcie5 row the score traffic adds ~0.5 of the product time, and k = hd products "
    "run below 0.7 of peak",
)


# The products in 16-bit compute (codelets/model_codelets.c: perfmodels dos_linear_fwd16, ...):
# cublasGemmEx on 16-bit operands with fp32 accumulation on the GPU; on the CPU the
# operands are widened to fp32 and multiplied by the same single-threaded sgemm.
GEMM16_EFFICIENCY = Num(
    0.5,
    "of peak",
    "assumption",
    "fraction of the dense bf16 tensor-core peak that the model's products reach: large square cuBLAS bf16 "
    "products reach 0.6-0.8 of it, the model's thin ones (n = B*T tokens, k = hd in attention) and their "
    "16-bit outputs less; replace with `dos-bench gemm` and a calibrated run",
)
CPU_GEMM16_FACTOR = Num(
    1 / 1.17,
    "of the fp32 rate",
    "measured",
    "the CPU widens 16-bit operands and runs the fp32 sgemm: on the development VM the bf16 default run's forward "
    "and backward task time was 1.17x fp32's (results/mixed-precision-2026-11-29.md)",
)


def gpu_gemm16(peak_tflops, what):
    return Num(
        peak_tflops * 1e12 * GEMM16_EFFICIENCY.value,
        "FLOP/s",
        "estimate",
        f"{what}; x {GEMM16_EFFICIENCY.value} tensor-core efficiency (assumption)",
    )


def gpu_sgemm(peak_tflops, what):
    return Num(
        peak_tflops * 1e12 * SGEMM_EFFICIENCY.value,
        "FLOP/s",
        "estimate",
        f"{what}; x {SGEMM_EFFICIENCY.value} SGEMM efficiency (assumption)",
    )


def cpu_sgemm_core(flop_per_cycle, ghz, what):
    return Num(
        flop_per_cycle * ghz * 1e9 * SGEMM_EFFICIENCY.value,
        "FLOP/s",
        "estimate",
        f"{what}: {flop_per_cycle} fp32 FLOP/cycle at {ghz} GHz = {flop_per_cycle * ghz:.0f} GFLOP/s peak "
        f"x {SGEMM_EFFICIENCY.value} SGEMM efficiency (assumption)",
    )


# Two 512-bit FMA units: 2 x 16 lanes x 2 FLOP (multiply and add) per cycle.
AVX512_2FMA = 64
# Two 256-bit FMA units (AVX2; also AMD Zen 4, which runs AVX-512 on 256-bit units).
AVX2_2FMA = 32


def derived_host_bw(params, seconds, what):
    return Num(
        ADAM_BYTES * params / seconds,
        "B/s",
        "derived",
        f"{ADAM_BYTES} B/param x {params:.0e} params / {seconds} s ({what})",
    )


MACHINES = {
    m.name: m
    for m in [
        Machine(
            name="h100-pcie5",
            title="one rank of the published 4xH100 node (DOS paper, DeepSpeed logs): "
            "1 H100 80 GB, 48 cores, PCIe Gen5",
            gpu_model="NVIDIA H100 80GB HBM3",
            cores=Num(
                48, "cores", "assumption", "one rank's share of the node, as docs/background.md describes it"
            ),
            cpu_workers=ONE_CPU_WORKER,
            host_mem=Num(None, "B", "unknown", "not published in our sources; the simulation does not use it"),
            host_bw=derived_host_bw(
                5e9, 2.27, "docs/background.md: all-CPU step of the 20B model, one rank, ZeRO-3 log: 2271 ms"
            ),
            gpu_mem=Num(
                81559 * MIB,
                "B",
                "estimate",
                "what nvidia-smi reports as memory.total for an H100 80GB HBM3 (81559 MiB)",
            ),
            gpu_bw=Num(
                100e9 * ADAM_BYTES,
                "B/s",
                "derived",
                "docs/background.md: GPU Adam ~100 G params/s on H100 (~1 ms per 1e8) x 28 B/param; "
                "0.84 of the 3.35 TB/s datasheet HBM3 bandwidth",
            ),
            pcie_h2d=Num(
                25 * GB,
                "B/s",
                "published",
                "docs/background.md worked example: 25 GB/s each way (the logs' best setting sustained ~19 GB/s)",
            ),
            pcie_d2h=Num(25 * GB, "B/s", "published", "as H2D: PCIe is full duplex"),
            pcie_latency=PCIE_LATENCY,
            cpu_task_overhead=CPU_OVERHEAD,
            gpu_task_overhead=GPU_OVERHEAD,
            cpu_sgemm_core=cpu_sgemm_core(
                AVX512_2FMA,
                2.0,
                "the node's CPU is not in our sources; assumed a server core with two AVX-512 FMA units "
                "(Xeon Sapphire Rapids class) at a 2.0 GHz all-core AVX-512 clock",
            ),
            gpu_sgemm=gpu_sgemm(
                67,
                "H100 SXM5 datasheet FP32 (non-tensor) 67 TFLOPS: this row's GPU is the SXM5 part (nvidia-smi's "
                "'H100 80GB HBM3', HBM3 at 3.35 TB/s; GPU Adam's derived 2.8 TB/s is beyond the 2.0 TB/s of the "
                "H100 PCIe card, whose FP32 peak is 51.2 TFLOPS)",
            ),
            gpu_gemm16=gpu_gemm16(989, "H100 SXM5 datasheet dense BF16/FP16 tensor 989 TFLOPS (1979 with sparsity)"),
        ),
        Machine(
            name="a100-pcie4",
            title="one rank of the published 4xA100-40GB node (DOS paper): 1 A100 40 GB, PCIe Gen4",
            gpu_model="NVIDIA A100-SXM4-40GB",
            cores=Num(None, "cores", "unknown", "not published in our sources; the CPU is modelled by its bandwidth"),
            cpu_workers=ONE_CPU_WORKER,
            host_mem=Num(None, "B", "unknown", "not published in our sources; the simulation does not use it"),
            host_bw=derived_host_bw(5e9, 5.20, "docs/background.md: 4xA100 all-CPU step of the 20B model, 5.20 s"),
            gpu_mem=Num(
                40960 * MIB,
                "B",
                "estimate",
                "what nvidia-smi reports as memory.total for an A100-SXM4-40GB (40960 MiB; the PCIe card: 40536 MiB)",
            ),
            gpu_bw=Num(
                0.84 * 1555 * GB,
                "B/s",
                "estimate",
                "A100 40GB datasheet HBM2 1555 GB/s x 0.84, the fraction the H100 row derives (2.8 / 3.35)",
            ),
            pcie_h2d=Num(
                12.5 * GB,
                "B/s",
                "estimate",
                "12-13 GB/s each way sustained (task brief): 0.40 of Gen4 x16's 31.5 GB/s, "
                "the fraction the H100 node sustains (25 of 63 GB/s)",
            ),
            pcie_d2h=Num(12.5 * GB, "B/s", "estimate", "as H2D: PCIe is full duplex"),
            pcie_latency=PCIE_LATENCY,
            cpu_task_overhead=CPU_OVERHEAD,
            gpu_task_overhead=GPU_OVERHEAD,
            cpu_sgemm_core=cpu_sgemm_core(
                AVX2_2FMA,
                2.5,
                "the node's CPU is not in our sources; assumed an AMD EPYC Rome/Milan core as in DGX A100 "
                "(AVX2, two 256-bit FMA units) at a 2.5 GHz all-core clock",
            ),
            gpu_sgemm=gpu_sgemm(19.5, "A100 datasheet FP32 (non-tensor) 19.5 TFLOPS, the same for SXM4 and PCIe"),
            gpu_gemm16=gpu_gemm16(312, "A100 datasheet dense BF16/FP16 tensor 312 TFLOPS (624 with sparsity)"),
        ),
        Machine(
            name="h200",
            title="the machine lent to some tasks: 1 H200 141 GB, 16 cores, 128 GiB, PCIe Gen5 "
            "(estimates until calibrated)",
            gpu_model="NVIDIA H200",
            cores=Num(16, "cores", "published", "the device tool's description: 16 CPU cores"),
            cpu_workers=ONE_CPU_WORKER,
            host_mem=Num(128 * GIB, "B", "published", "the device tool's description: 128 GiB"),
            host_bw=Num(
                120 * GB,
                "B/s",
                "estimate",
                "~7.5 GB/s per core x 16 cores of a DDR5 server; replace with dos-bench adam's "
                "'starpu, 16 cores, 1e8 params' GB/s from tools/device-check.sh",
            ),
            gpu_mem=Num(
                143771 * MIB,
                "B",
                "estimate",
                "what nvidia-smi reports as memory.total for an H200 (143771 MiB); device-check's machine.txt and "
                "StarPU's platform file record the real one",
            ),
            gpu_bw=Num(
                4.3e12,
                "B/s",
                "measured",
                "docs/background.md: ~4.3 TB/s device-to-device copy measured on this H200 (4.8 TB/s datasheet); "
                "GPU Adam assumed to reach it until dos_adam's CUDA model is calibrated",
            ),
            pcie_h2d=Num(
                50 * GB,
                "B/s",
                "estimate",
                "docs/background.md: ~50 GB/s per direction on Gen5 x16; replace with StarPU's bus calibration",
            ),
            pcie_d2h=Num(50 * GB, "B/s", "estimate", "as H2D: PCIe is full duplex"),
            pcie_latency=PCIE_LATENCY,
            cpu_task_overhead=CPU_OVERHEAD,
            gpu_task_overhead=GPU_OVERHEAD,
            cpu_sgemm_core=cpu_sgemm_core(
                AVX512_2FMA,
                2.0,
                "the lent machine's CPU model is not recorded yet; assumed a core with two AVX-512 FMA units "
                "(Xeon Sapphire/Emerald Rapids, as in HGX H200 servers) at 2.0 GHz; half that if its 16 cores are "
                "hyperthreads or Zen 4 cores; replace with a single-core OpenBLAS SGEMM measurement",
            ),
            gpu_sgemm=gpu_sgemm(
                67,
                "H200 SXM datasheet FP32 (non-tensor) 67 TFLOPS, not the H200 NVL's 60: the device tool and this "
                "row name it 'NVIDIA H200', nvidia-smi's name for the SXM part (the PCIe card is 'NVIDIA H200 NVL'), "
                "and 1 GPU with 16 cores and 128 GiB looks like one GPU's share of an 8-GPU HGX (SXM) server",
            ),
            gpu_gemm16=gpu_gemm16(
                989, "H200 SXM datasheet dense BF16/FP16 tensor 989 TFLOPS, as H100 SXM5 (same GH100 compute)"
            ),
        ),
    ]
}


# ---- nodes of several GPUs driven by one process ----------------------------------------
#
# Each is G copies of a one-GPU row above (same GPU, same x16 link per GPU, same perfmodels),
# with the whole node's CPU pool and a PCIe tree: two sockets, GPUs in pairs behind PCIe
# switches, each switch with one x16 uplink to its socket, so the two GPUs of a pair share
# that uplink. The host side above the switches (root complexes, DRAM) is not a bottleneck
# for DMA in the simulation: SimGrid does not model host memory bandwidth (README: the model).

TWO_SOCKETS = Num(
    2,
    "sockets",
    "assumption",
    "the common layout of 4- and 8-GPU PCIe servers (issue 17); the published nodes' topology is not in our sources",
)
GPU_PAIRS = Num(
    2,
    "GPUs per switch",
    "assumption",
    "GPUs in pairs behind PCIe switches, as in common 8-GPU servers (issue 17); check with `nvidia-smi topo -m`",
)


def switch_uplink(base, direction):
    link = base.pcie_h2d if direction == "h2d" else base.pcie_d2h
    return Num(
        link.value,
        "B/s",
        "assumption",
        f"one x16 uplink per switch, of the same generation and sustained rate as a GPU's own x16 link "
        f"({base.name} row's pcie_{direction}): the pair shares it",
    )


def node_of(base, gpus, title, host_bw):
    """A node of `gpus` GPUs of the one-GPU row `base`, with the node's CPU pool `host_bw`."""
    return replace(
        base,
        name=f"{base.name}-x{gpus}",
        title=title,
        host_bw=host_bw,
        gpus=Num(gpus, "GPUs", "choice", "the node of issue 17, driven by one process"),
        sockets=TWO_SOCKETS,
        gpus_per_switch=GPU_PAIRS,
        switch_h2d=switch_uplink(base, "h2d"),
        switch_d2h=switch_uplink(base, "d2h"),
        cores=Num(None, "cores", "unknown", "documentation only; the CPU pool is modelled by host_bw"),
        host_mem=Num(None, "B", "unknown", "not used by the simulation"),
    )


def ranks_host_bw(base, ranks, status, what):
    return Num(
        ranks * base.host_bw.value,
        "B/s",
        status,
        f"{ranks} x the {base.name} row's host_bw ({base.host_bw.value / GB:.4g} GB/s): {what}",
    )


# DDR5-4800: 4800 MT/s x 8 bytes per channel; 8 channels per socket in Sapphire Rapids.
DDR5_4800_TWO_SOCKETS = 2 * 8 * 4800e6 * 8


def _multi_gpu_nodes():
    h100, a100, h200 = MACHINES["h100-pcie5"], MACHINES["a100-pcie4"], MACHINES["h200"]
    return [
        node_of(
            h100,
            4,
            "the published 4xH100 node driven by one process: 4 H100 80 GB, PCIe Gen5, GPUs in pairs behind switches",
            ranks_host_bw(
                h100, 4, "derived", "the published node's 4 ranks ran their all-CPU 20B updates (2271 ms) at once"
            ),
        ),
        node_of(
            h100,
            8,
            "an 8xH100 PCIe Gen5 node driven by one process: two sockets, GPUs in pairs behind 4 switches",
            ranks_host_bw(
                h100,
                8,
                "assumption",
                f"the published node's CPU share per GPU; {8 * h100.host_bw.value / GB:.0f} GB/s is "
                f"{8 * h100.host_bw.value / DDR5_4800_TWO_SOCKETS:.2f} of the {DDR5_4800_TWO_SOCKETS / GB:.0f} GB/s "
                "peak of two sockets of 8 DDR5-4800 channels",
            ),
        ),
        node_of(
            a100,
            4,
            "the published 4xA100-40GB node driven by one process: 4 A100, PCIe Gen4, GPUs in pairs behind switches",
            ranks_host_bw(
                a100, 4, "derived", "the published node's 4 ranks ran their all-CPU 20B updates (5.20 s) at once"
            ),
        ),
        node_of(
            h200,
            8,
            "an 8xH200 node (HGX class) driven by one process: two sockets, GPUs in pairs behind 4 PCIe Gen5 switches",
            Num(
                0.7 * DDR5_4800_TWO_SOCKETS,
                "B/s",
                "estimate",
                f"two sockets of 8 DDR5-4800 channels ({DDR5_4800_TWO_SOCKETS / GB:.0f} GB/s peak, Xeon Sapphire "
                "Rapids as in HGX H200 servers) x 0.7 reached by a streaming kernel (assumption); 8 x the h200 "
                "row's 120 GB/s would exceed the peak",
            ),
        ),
    ]


MACHINES.update({m.name: m for m in _multi_gpu_nodes()})


# ---- networks between simulated nodes (StarPU-MPI over SMPI: tools/sim-cluster.sh) -------


@dataclass(frozen=True)
class Network:
    name: str
    title: str
    bandwidth: Num  # B/s per node and direction, sustained by large MPI messages
    latency: Num  # s, one way, node to node through the switch


# One rank per node, as on clusters whose nodes have one NIC per GPU (DGX H100: eight
# 400 Gb/s ConnectX-7 for eight GPUs), each node's link full duplex, the switch fabric
# non-blocking (a full-bisection fat tree: no two pairs of nodes slow each other).
FABRIC = Num(
    None,
    "",
    "choice",
    "one link per node, full duplex (SimGrid SPLITDUPLEX), into a non-blocking switch (a FATPIPE backbone of the "
    "link's bandwidth): the full-bisection fat trees training clusters are built as",
)
IB_EFFICIENCY = 0.96
IB_LATENCY = Num(
    1.0e-6,
    "s",
    "estimate",
    "MPI ping-pong one way through one InfiniBand switch: adapter (ConnectX-6/7) and switch (Quantum, Quantum-2: "
    "~0.1 us port to port per datasheet) together ~1 us; replace with osu_latency on the target cluster",
)


def ib_bandwidth(gbit, what):
    return Num(
        gbit * 1e9 / 8 * IB_EFFICIENCY,
        "B/s",
        "estimate",
        f"{what}: {gbit} Gb/s per port = {gbit / 8:g} GB/s, x {IB_EFFICIENCY} for encoding and packet headers "
        "(assumption); replace with osu_bw on the target cluster",
    )


NETWORKS = {
    n.name: n
    for n in [
        Network(
            name="ib-ndr400",
            title="InfiniBand NDR, 400 Gb/s per node",
            bandwidth=ib_bandwidth(400, "NDR InfiniBand (NVIDIA ConnectX-7 adapter, Quantum-2 switch datasheets)"),
            latency=IB_LATENCY,
        ),
        Network(
            name="ib-hdr200",
            title="InfiniBand HDR, 200 Gb/s per node",
            bandwidth=ib_bandwidth(200, "HDR InfiniBand (NVIDIA ConnectX-6 adapter, Quantum switch datasheets)"),
            latency=IB_LATENCY,
        ),
    ]
}
DEFAULT_NETWORK = "ib-ndr400"

# SMPI scales a link's bandwidth and latency by factors calibrated on some past cluster
# (smpi/bw-factor, smpi/lat-factor); the table's numbers are already the sustained ones.
SMPI_OPTIONS = ["--cfg=smpi/bw-factor:0:1", "--cfg=smpi/lat-factor:0:1"]  # from message size 0, factor 1


def cluster_platform(network, nodes):
    """The SimGrid platform of `nodes` hosts node0... on `network`, as starpu_smpirun wants
    it: its first two lines (XML declaration, doctype) and the platform tags are dropped."""
    n = network
    return (
        "<?xml version='1.0'?>\n"
        "<!DOCTYPE platform SYSTEM 'https://simgrid.org/simgrid.dtd'>\n"
        '<platform version="4.1">\n'
        f"<!-- {nodes} nodes on {n.name} ({n.title}). Generated by tools/gen-machine.py from its NETWORKS "
        "table. -->\n"
        f'<cluster id="cluster" prefix="node" suffix="" radical="0-{nodes - 1}" speed="1Gf" '
        f'bw="{n.bandwidth.value:.0f}Bps" lat="{n.latency.value:g}s" sharing_policy="SPLITDUPLEX" '
        f'bb_bw="{n.bandwidth.value:.0f}Bps" bb_lat="0s" bb_sharing_policy="FATPIPE"/>\n'
        "</platform>\n"
    )


def write_cluster(out_dir, network, nodes):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cluster.xml"), "w", encoding="utf-8") as f:
        f.write(cluster_platform(NETWORKS[network], nodes))
    with open(os.path.join(out_dir, "hostfile"), "w", encoding="utf-8") as f:
        f.write("".join(f"node{i}\n" for i in range(nodes)))
    with open(os.path.join(out_dir, "smpi-options"), "w", encoding="utf-8") as f:
        f.write("\n".join(SMPI_OPTIONS) + "\n")


@dataclass(frozen=True)
class Codelet:
    symbol: str
    vectors: tuple  # element size of each vector buffer, in the task's buffer order
    variables: tuple  # byte size of each variable buffer, after the vectors
    traffic: int  # memory traffic per element, bytes
    traffic_note: str
    # elements per second one CPU core computes at most, where that and not the memory
    # bandwidth bounds the CPU time (None: bandwidth alone)
    cpu_core_rate: Optional[Num] = None

    def size(self, nx):
        """Data size as StarPU computes it by default: the sum of the buffers' sizes."""
        return sum(e * nx for e in self.vectors) + sum(self.variables)

    def size_per_element(self):
        return sum(self.vectors)


# The init-state codelet's CPU kernel draws one splitmix64 number per weight (2.6-2.9 ns
# an element, 2e7 elements of the 1b preset's layers, measured on one core of the 2-core
# development VM, gcc -O2): slower than the 12 B it writes at a core's share of the
# bandwidth.
INIT_STATE_CPU_RATE = Num(
    3.5e8, "elements/s", "measured", "codelets/init_state.c on one core of the development VM, 2.6-2.9 ns/element"
)

# The reference buffer layouts (the ones dos-bench calibrates): fp16 gradients, 16-bit
# working weights. An fp32 gradient (18 B of data, 30 B of traffic per param) or no
# weight16 (14 B, 26 B) is predicted from the same bytes-of-data slope, within 7%.
CODELETS = [
    Codelet(
        "dos_adam",
        (4, 4, 4, 2, 2),
        (),
        ADAM_BYTES,
        "read p, m, v (12) + fp16 grad (2); write p, m, v (12) + 16-bit weight (2)",
    ),
    Codelet("dos_cast", (4, 2), (), 6, "read fp32 master (4); write 16-bit weight (2)"),
    Codelet("dos_grad_stats", (2,), (16,), 2, "read fp16 grad (2); the 16-byte stats result is negligible"),
    Codelet("dos_grad_scale", (2,), (), 4, "read and write fp16 grad (2 + 2)"),
    Codelet(
        "dos_init_state",
        (4, 4, 4),
        (),
        12,
        "write p, m, v (12); a CPU core is bound by one draw per weight (INIT_STATE_CPU_RATE), a GPU is not",
        INIT_STATE_CPU_RATE,
    ),
]

# History entries: one per decade of subgroup sizes and one near the 32-bit limit of the
# codelets' element counts, each as if measured 10 times (StarPU's STARPU_CALIBRATE_MINIMUM).
# The regression is then valid (>= 10 samples, minx < 0.9 maxx: VALID_REGRESSION) and used
# for sizes within [0.9 minx, 1.1 maxx], i.e. 1 to 4.4e9 params; outside, StarPU looks
# the task's footprint up in the history, and the simulation aborts on a miss. The range
# starts at one parameter because the last subgroup of a model holds whatever is left
# (672 params for the tiny preset in 4096-param subgroups).
HISTORY_NX = [10**k for k in range(0, 10)] + [4 * 10**9]
SAMPLES_PER_ENTRY = 10


# ---- the example model's codelets (docs/model.md; codelets/model_codelets.c, codelets/flat.c) -----

FLOPS, BYTES = "flops", "bytes"  # what a codelet's perfmodel size counts
SGEMM, ATTENTION, BANDWIDTH = "sgemm", "attention", "bandwidth"  # the rate its time comes from
GEMM16, ATTENTION16 = "gemm16", "attention16"  # the same in 16-bit compute
NO_SLOWDOWN = Num(1, "x", "choice", "parallel over elements: runs at the bandwidth")


@dataclass(frozen=True)
class ModelCodelet:
    symbol: str
    size: str  # FLOPS: the perfmodel's size_base returns the operation count; BYTES: StarPU's default size
    rate: str  # SGEMM, ATTENTION or BANDWIDTH
    what: str  # what the size counts and what the task does
    gpu_slowdown: Num = NO_SLOWDOWN  # factor on the GPU time (serial reductions kept for bitwise determinism)


def _serial(factor, why):
    return Num(factor, "x", "estimate", why + "; replace with the CUDA calibration of a real run")


# Every task of these codelets has a variable number of vector buffers (dos_batch: three), so
# its footprint depends on the shapes of a run and cannot be written in advance: their
# perfmodels rely on the regression alone, valid over a range no real task leaves. For the
# byte-sized ones, one byte of memory traffic per byte of data (inputs read + outputs written
# = the sum of the buffers), except where `what` says otherwise. GPU slowdowns: estimated for
# the 1b preset (n = 1024 tokens, d = 2048, V = 50304) on the h100-pcie5 row, from the kernels
# in codelets/model_cuda.cu, and applied to every machine: a loop that one thread (or one lane
# of a warp) runs serially waits about one memory latency (~0.4 us) per token or per 32-byte
# sector; the factor shrinks as d grows.
MODEL_CODELETS = [
    ModelCodelet("dos_linear_fwd", FLOPS, SGEMM, "2 n in out: y = x w^T (+ residual)"),
    ModelCodelet("dos_linear_bwd_data", FLOPS, SGEMM, "2 n in out: dx = dy w"),
    ModelCodelet("dos_linear_bwd_weight", FLOPS, SGEMM, "2 n in out: dw = dy^T x"),
    ModelCodelet(
        "dos_attention_fwd", FLOPS, ATTENTION, "4 B H T^2 hd: q k^T and p v over full T x T blocks, causal softmax"
    ),
    ModelCodelet(
        "dos_attention_bwd", FLOPS, ATTENTION, "8 B H T^2 hd: four batched products and the softmax backward"
    ),
    # 16-bit compute: the same kernels under perfmodels of their own (codelets/model_codelets.c)
    ModelCodelet("dos_linear_fwd16", FLOPS, GEMM16, "2 n in out, 16-bit operands: y = x w^T (+ residual)"),
    ModelCodelet("dos_linear_bwd_data16", FLOPS, GEMM16, "2 n in out, 16-bit operands: dx = dy w"),
    ModelCodelet("dos_linear_bwd_weight16", FLOPS, GEMM16, "2 n in out, 16-bit operands, fp32 dw: dw = dy^T x"),
    ModelCodelet("dos_attention_fwd16", FLOPS, ATTENTION16, "4 B H T^2 hd, 16-bit q, k, v and probabilities"),
    ModelCodelet("dos_attention_bwd16", FLOPS, ATTENTION16, "8 B H T^2 hd, 16-bit operands, fp32 softmax backward"),
    ModelCodelet(
        "dos_embed_fwd",
        BYTES,
        BANDWIDTH,
        "ids, tok_emb, pos_emb, x: the whole tables count though only n rows are read (for the 1b preset "
        "the data is ~17x the traffic: an overestimate of ~0.15 ms per micro-batch on the GPU)",
    ),
    ModelCodelet(
        "dos_embed_bwd",
        BYTES,
        BANDWIDTH,
        "ids, dx, dtok_emb, dpos_emb: the V x d gradient is zeroed (first micro-batch), then rows added",
        _serial(
            5,
            "embed_bwd_tok_kernel: d threads, each adding the n tokens' rows in token order through a dependent "
            "read-modify-write (~2 latencies per token: ~0.6 ms for n = 1024) after the ~0.14 ms memset of the "
            "V x d gradient, against 0.15 ms for its 428 MB at 2.8 TB/s: x4 to x6",
        ),
    ),
    ModelCodelet(
        "dos_rmsnorm_fwd",
        BYTES,
        BANDWIDTH,
        "x, w, y, rstd",
        _serial(
            10,
            "rmsnorm_fwd_kernel: one lane per row sums x^2 over d serially (~70 us for rows of 2048 floats), "
            "against 6 us for its 16 MB at 2.8 TB/s",
        ),
    ),
    ModelCodelet(
        "dos_rmsnorm_bwd",
        BYTES,
        BANDWIDTH,
        "x, w, rstd, dy, dx, dw",
        _serial(
            15,
            "rmsnorm_bwd_dw_kernel: d threads (under one warp per SM) each sum the n tokens in order "
            "(~90 us for n = 1024), after the dx kernel's serial per-row dot product on one lane (~70 us), "
            "against 9 us for its 25 MB at 2.8 TB/s: x10 to x30",
        ),
    ),
    ModelCodelet("dos_gelu_fwd", BYTES, BANDWIDTH, "u, y (erff per element: the GPU hides it, a CPU core does not)"),
    ModelCodelet("dos_gelu_bwd", BYTES, BANDWIDTH, "u, dy, du (erff and expf per element)"),
    ModelCodelet(
        "dos_xent",
        BYTES,
        BANDWIDTH,
        "logits, targets, loss, dlogits (expf per logit)",
        _serial(
            15,
            "xent_kernel: lane 0 of each row's warp takes the max, then the sum of expf, over the V = 50304 "
            "logits serially (two passes of ~1 ms for 1024 rows), against 0.15 ms for its 412 MB at 2.8 TB/s: "
            "x10 to x25",
        ),
    ),
    ModelCodelet(
        "dos_flat_copy",
        BYTES,
        BANDWIDTH,
        "destination + source tensors (gradient gather, weight refresh, with dtype conversion): a source "
        "tensor counts whole when only a slice of it is copied, an overestimate where a subgroup takes a small "
        "slice of a large tensor",
    ),
    ModelCodelet(
        "dos_grad_sum",
        BYTES,
        BANDWIDTH,
        "the sum and the ranks' partial gradients of one chunk of a subgroup (a data-parallel job's scatter "
        "exchange; CPU only: the CUDA part is never used)",
    ),
    ModelCodelet(
        "dos_batch",
        BYTES,
        BANDWIDTH,
        "corpus, ids, targets (CPU only; the CUDA part is never used): the whole corpus counts though only "
        "B (T + 1) bytes of it are read",
    ),
]

# Sizes of the history entries written for them: one per decade from 1 FLOP to 1e17 (a linear
# layer of the 20b preset, 2 x 2048 tokens x 5120 x 50304, is 1.1e12; attention, 8 x 64 x
# 2048^2 x 80 = 1.7e11) and from 1 byte to 10 TB, so the regression covers [0.9, 1.1e17] FLOP
# and [0.9, 1.1e13] bytes. Their hashes are synthetic (a CRC of the size): real footprints
# come from a run's buffer shapes, so no task will look them up; they are there only so that
# StarPU counts the samples that make the regression valid.
HISTORY_FLOPS = [10**k for k in range(0, 18)]
HISTORY_BYTES = [10**k for k in range(0, 14)]

PERFMODEL_VERSION = 45  # _STARPU_PERFMODEL_VERSION of StarPU 1.4
CPU_WORKER, CUDA_WORKER = 0, 1  # enum starpu_worker_archtype
VECTOR_INTERFACE_ID, VARIABLE_INTERFACE_ID = 2, 5  # enum starpu_data_interface_id
# Rows and columns StarPU's native writer puts in the .bandwidth/.latency matrices
# (STARPU_MAXNODES of a default 1.4 build, as tools/device-check.sh's calibration writes
# them). The reader fills missing columns and rows with nan, so builds with a larger
# STARPU_MAXNODES (the SimGrid build has 32) read them the same.
MATRIX_NODES = 8

# ---- footprints: StarPU's CRC32C (big-endian polynomial, src/common/hash.c) ------------


def _crc32c_be_byte(byte, crc):
    crc ^= byte << 24
    for _ in range(8):
        crc = ((crc << 1) ^ (0x1EDC6F41 if crc & 0x80000000 else 0)) & 0xFFFFFFFF
    return crc


def crc32c_be(value, crc):
    """starpu_hash_crc32c_be: the uint32 hashed in memory order (little endian here)."""
    for byte in struct.pack("<I", value):
        crc = _crc32c_be_byte(byte, crc)
    return crc


def synthetic_footprint(size):
    """A hash for a history entry that stands for no real task: the CRC of the 64-bit size."""
    return crc32c_be(size >> 32, crc32c_be(size & 0xFFFFFFFF, 0))


def footprint(codelet, nx):
    """_starpu_compute_buffers_footprint for a task on these buffers: each handle's footprint
    is crc(interface footprint, interface id); the task's chains them in buffer order."""
    handle_footprints = [crc32c_be(crc32c_be(nx, 0), VECTOR_INTERFACE_ID) for _ in codelet.vectors]
    handle_footprints += [crc32c_be(crc32c_be(b, 0), VARIABLE_INTERFACE_ID) for b in codelet.variables]
    fp = 0
    for h in handle_footprints:
        fp = crc32c_be(h, fp)
    return fp


# ---- codelet perfmodels ---------------------------------------------------------------


def regression(machine, codelet, device, cpu_workers):
    """(a, b, c) of time_us = a * size^b + c, size in bytes of data."""
    if device == CPU_WORKER:
        # W workers share the host bandwidth: each task gets 1/W of it.
        bw = machine.host_bw.value / cpu_workers
        overhead = machine.cpu_task_overhead.value
    else:
        bw = machine.gpu_bw.value
        overhead = machine.gpu_task_overhead.value
    a = codelet.traffic / codelet.size_per_element() / bw * 1e6
    if device == CPU_WORKER and codelet.cpu_core_rate is not None:
        a = max(a, 1 / (codelet.cpu_core_rate.value * codelet.size_per_element()) * 1e6)
    return a, 1.0, overhead * 1e6


def model_rate(machine, mc, device, cpu_workers):
    """(rate, unit) of a model codelet on one device: FLOP/s or B/s, before any slowdown."""
    if mc.rate == BANDWIDTH:
        # As regression(): W workers share the host bandwidth.
        return (machine.host_bw.value / cpu_workers if device == CPU_WORKER else machine.gpu_bw.value), "B/s"
    # A product runs on one core (OpenBLAS made single-threaded), whatever W.
    if mc.rate in (GEMM16, ATTENTION16):
        rate = machine.cpu_sgemm_core.value * CPU_GEMM16_FACTOR.value if device == CPU_WORKER else machine.gpu_gemm16.value
    else:
        rate = machine.cpu_sgemm_core.value if device == CPU_WORKER else machine.gpu_sgemm.value
    if mc.rate in (ATTENTION, ATTENTION16):
        rate *= ATTENTION_EFFICIENCY.value
    return rate, "FLOP/s"


def model_regression(machine, mc, device, cpu_workers):
    """(a, b, c) of time_us = a * size^b + c, size in FLOP or bytes of data (mc.size)."""
    rate, _ = model_rate(machine, mc, device, cpu_workers)
    if device == CPU_WORKER:
        slowdown, overhead = 1.0, machine.cpu_task_overhead.value
    else:
        slowdown, overhead = mc.gpu_slowdown.value, machine.gpu_task_overhead.value
    return slowdown / rate * 1e6, 1.0, overhead * 1e6


def _e(x):
    return "%-15e" % x


def perfmodel_block(machine, codelet, comb, device, cpu_workers, devid=0):
    a, b, c = regression(machine, codelet, device, cpu_workers)
    entries = []
    for nx in sorted(HISTORY_NX, reverse=True):  # StarPU lists the newest entry first
        size = codelet.size(nx)
        mean = a * size**b + c
        entries.append((footprint(codelet, nx), size, mean))
    return _perfmodel_block_text(comb, device, devid, (a, b, c), entries)


def model_perfmodel_block(machine, mc, comb, device, cpu_workers, devid=0):
    a, b, c = model_regression(machine, mc, device, cpu_workers)
    sizes = HISTORY_FLOPS if mc.size == FLOPS else HISTORY_BYTES
    entries = [(synthetic_footprint(size), size, a * size**b + c) for size in sorted(sizes, reverse=True)]
    assert len({fp for fp, _, _ in entries}) == len(entries), f"{mc.symbol}: synthetic footprints collide"
    return _perfmodel_block_text(comb, device, devid, (a, b, c), entries)


def _perfmodel_block_text(comb, device, devid, abc, entries):
    """One combination's part of a perfmodel file, as StarPU 1.4.10's dump_per_arch_model_file
    writes it, from the regression and the history entries (footprint, size, mean us)."""
    a, b, c = abc
    n = SAMPLES_PER_ENTRY * len(entries)
    lnx = [math.log(s) for _, s, _ in entries]
    lny = [math.log(m) for _, _, m in entries]
    sumlnx = SAMPLES_PER_ENTRY * sum(lnx)
    sumlnx2 = SAMPLES_PER_ENTRY * sum(x * x for x in lnx)
    sumlny = SAMPLES_PER_ENTRY * sum(lny)
    sumlnxlny = SAMPLES_PER_ENTRY * sum(x * y for x, y in zip(lnx, lny))
    beta = (n * sumlnxlny - sumlnx * sumlny) / (n * sumlnx2 - sumlnx * sumlnx)
    alpha = math.exp((sumlny - beta * sumlnx) / n)
    minx = min(s for _, s, _ in entries)
    maxx = max(s for _, s, _ in entries)

    arch = "cpu" if device == CPU_WORKER else "cuda"
    out = []
    out.append("####################\n")
    out.append(f"# COMB_{comb}\n")
    out.append("# number of types devices\n")
    out.append("1\n")
    out.append("####################\n")
    out.append("# DEV_0\n")
    out.append("# device type (CPU - 0, CUDA - 1, OPENCL - 2, MPI_MS - 5, TCPIP_MS - 6)\n")
    out.append(f"{device}\n")
    out.append("####################\n")
    out.append("# DEV_0\n")
    out.append("# device id \n")
    out.append(f"{devid}\n")
    out.append("####################\n")
    out.append("# DEV_0\n")
    out.append("# number of cores \n")
    out.append("1\n")
    out.append("##########\n")
    out.append("# number of implementations\n")
    out.append("1\n")
    out.append("#####\n")
    out.append(f"# Model for {arch}{devid}_impl0 (Comb{comb})\n")
    out.append(f"# number of entries\n{len(entries)}\n")
    out.append("# sumlnx\tsumlnx2\t\tsumlny\t\tsumlnxlny\talpha\t\tbeta\t\tn\tminx\t\tmaxx\n")
    out.append(f"{_e(sumlnx)}\t{_e(sumlnx2)}\t{_e(sumlny)}\t{_e(sumlnxlny)}\t")
    out.append(f"{_e(alpha)}\t{_e(beta)}\t{n}\t{minx:<15d}\t{maxx:<15d}\n")
    out.append("# a\t\tb\t\tc\n")
    out.append(f"{_e(a)}\t{_e(b)}\t{_e(c)}\n")
    out.append("# not multiple-regression-base\n")
    out.append("0\n")
    out.append("# hash\t\tsize\t\tflops\t\tmean (us or J)\tdev (us or J)\tsum\t\tsum2\t\tn\n")
    for fp, size, mean in entries:
        s = SAMPLES_PER_ENTRY
        out.append(
            f"{fp:08x}\t{size:<15d}\t{_e(0.0)}\t{_e(mean)}\t{_e(0.0)}\t{_e(s * mean)}\t{_e(s * mean * mean)}\t{s}\n"
        )
    out.append("\n")
    return "".join(out)


def perfmodel_file(machine, codelet, cpu_workers):
    head = (
        "##################\n"
        "# Performance Model Version\n"
        f"{PERFMODEL_VERSION}\n\n"
        "####################\n"
        "# COMBs\n"
        "# number of combinations\n"
        f"{1 + machine.ngpus()}\n"
    )
    if isinstance(codelet, ModelCodelet):
        block = model_perfmodel_block
    else:
        block = perfmodel_block
    # One combination per CUDA device, as StarPU calibrates them (its CUDA perfmodels are
    # per device unless STARPU_PERF_MODEL_HOMOGENEOUS_CUDA=1); the CPU workers share one.
    out = head + block(machine, codelet, 0, CPU_WORKER, cpu_workers)
    for k in range(machine.ngpus()):
        out += block(machine, codelet, 1 + k, CUDA_WORKER, cpu_workers, devid=k)
    return out


# ---- bus files --------------------------------------------------------------------------


def matrix_file(values):
    """values[src][dst] for nodes 0 (NUMA 0) and 1..G (CUDA 0..G-1); written as StarPU's
    write_bus_{bandwidth,latency}_file_content does: a header with a trailing tab,
    max(MATRIX_NODES, G + 2) tab-separated columns (no trailing tab), nan outside the
    machine, then the all-nan rows: at least one, or StarPU's reader leaves the last
    node's row and column nan (seen with 8 GPUs)."""
    nodes = len(values)
    size = max(MATRIX_NODES, nodes + 1)
    header = ["to NUMA 0"] + [f"to CUDA {k}" for k in range(nodes - 1)]
    out = ["# " + "".join(h + "\t" for h in header) + "\n"]
    for src in range(size):
        row = []
        for dst in range(size):
            if src < nodes and dst < nodes:
                row.append("%e" % values[src][dst])
            else:
                row.append("nan")
        out.append("\t".join(row) + "\n")
    return "".join(out)


def peer_bandwidth(m, a, b):
    """B/s of a GPU a -> GPU b copy: both GPUs' own links, and both switches' uplinks
    when they sit behind different switches."""
    bw = min(m.pcie_d2h.value, m.pcie_h2d.value)
    if m.switch_of(a) != m.switch_of(b) and m.switch_h2d:
        bw = min(bw, m.switch_d2h.value, m.switch_h2d.value)
    return bw


def bandwidth_file(m):
    mb = 1e6  # StarPU's MB/s: bytes per microsecond
    g = m.ngpus()
    h2d, d2h = m.pcie_h2d.value, m.pcie_d2h.value
    if m.switch_h2d:
        h2d, d2h = min(h2d, m.switch_h2d.value), min(d2h, m.switch_d2h.value)
    values = [[0.0] + [h2d / mb] * g]
    for a in range(g):
        values.append([d2h / mb] + [0.0 if a == b else peer_bandwidth(m, a, b) / mb for b in range(g)])
    return matrix_file(values)


def latency_file(m):
    us = m.pcie_latency.value * 1e6
    g = m.ngpus()
    # A peer copy crosses two links (a's up, b's down): twice the latency.
    values = [[0.0] + [us] * g] + [[us] + [0.0 if a == b else 2 * us for b in range(g)] for a in range(g)]
    return matrix_file(values)


def config_file(m, cpu_workers):
    # write_bus_config_file_content; the CPU count is that of the simulated machine.
    lines = ["# Current configuration\n", f"{cpu_workers} # Number of CPUs\n"]
    kinds = [("NUMA", 1), ("CUDA", m.ngpus()), ("OpenCL", 0), ("FPGA", 0), ("Disk", 0)]
    kinds += [("MPI_MS", 0), ("TCPIP_MS", 0), ("HIP", 0)]
    for kind, n in kinds:
        lines.append(f"{n} # Number of {kind} nodes\n")
    return "".join(lines)


def affinity_file(m):
    # write_bus_affinity_file_content: every GPU prefers NUMA node 0, the one host memory
    # node the simulation has (pinned buffers are assumed on each GPU's own socket).
    return "# GPU\tNUMA0\t\n" + "".join(f"{k}\t0\t\n" for k in range(m.ngpus()))


def platform_file(m, cpu_workers):
    """The SimGrid platform (format 4), laid out as StarPU 1.4.10's
    write_bus_platform_file_content writes it, with one change: the shared link is named
    "Host", as in StarPU's shipped examples and as simgrid.c's route counting expects
    (1.4.10's flat writer names it "Interconnect"). Both directions cross it, so its
    bandwidth is the sum of both: H2D and D2H each get their own link's bandwidth when
    they run together (full duplex), and share it when two go the same way.

    With several GPUs behind PCIe switches, a GPU's routes to and from RAM also cross its
    switch's "up" (to the host) or "down" link, which the GPUs of the switch share, and its
    "through" link, which simgrid.c's _starpu_simgrid_count_ngpus looks for to count the
    GPUs sharing a bridge. Peer copies between GPUs of one switch stay below it; between
    switches they cross the host. The "Host" link carries every switch's traffic both ways
    and never binds: SimGrid does not model host memory bandwidth."""
    h2d, d2h, lat = m.pcie_h2d.value, m.pcie_d2h.value, m.pcie_latency.value
    g = m.ngpus()
    switches = sorted({m.switch_of(k) for k in range(g)}) if m.switch_h2d else []
    if switches:
        host_bw = len(switches) * (m.switch_h2d.value + m.switch_d2h.value)
    else:
        host_bw = g * (h2d + d2h)
    out = [
        "<?xml version='1.0'?>\n",
        "<!DOCTYPE platform SYSTEM 'http://simgrid.gforge.inria.fr/simgrid/simgrid.dtd'>\n",
        f"<!-- {m.name}: {m.title}. "
        "Generated by tools/gen-machine.py from its MACHINES table: edit that, not this. -->\n",
        ' <platform version="4">\n',
        ' <config id="General">\n',
        '   <prop id="network/TCP-gamma" value="-1"></prop>\n',
        '   <prop id="network/latency-factor" value="1"></prop>\n',
        '   <prop id="network/bandwidth-factor" value="1"></prop>\n',
        '   <prop id="network/crosstraffic" value="0"></prop>\n',
        '   <prop id="network/weight-S" value="0.0"></prop>\n',
        " </config>\n",
        ' <AS  id="AS0"  routing="Full">\n',
        '   <host id="MAIN" speed="1f"/>\n',
    ]
    # Task durations come from the perfmodels (flops = length x speed), so speeds only
    # need to be the same everywhere.
    for i in range(cpu_workers):
        out.append(f'   <host id="CPU{i}" speed="2000000000f"/>\n')
    for k in range(g):
        out += [
            f'   <host id="CUDA{k}" speed="2000000000f">\n',
            f'     <prop id="model" value="{m.gpu_model}"/>\n',
            f'     <prop id="memsize" value="{int(m.gpu_mem.value)}"/>\n',
            '     <prop id="memcpy_peer" value="1"/>\n',
            "   </host>\n",
        ]
    out += [
        "\n",
        '   <host id="RAM" speed="1f"/>\n',
        f'   <link id="Host" bandwidth="{host_bw:f}Bps" latency="0.000000s"/>\n',
        "\n",
    ]
    for k in range(g):
        out.append(f'   <link id="RAM-CUDA{k}" bandwidth="{h2d:f}Bps" latency="{lat:f}s"/>\n')
        out.append(f'   <link id="CUDA{k}-RAM" bandwidth="{d2h:f}Bps" latency="{lat:f}s"/>\n')
    for j in switches:
        up, down = m.switch_d2h.value, m.switch_h2d.value
        out.append(f'   <link id="PCIe switch {j} up" bandwidth="{up:f}Bps" latency="0.000000s"/>\n')
        out.append(f'   <link id="PCIe switch {j} down" bandwidth="{down:f}Bps" latency="0.000000s"/>\n')
        out.append(f'   <link id="PCIe switch {j} through" bandwidth="{up + down:f}Bps" latency="0.000000s"/>\n')
    out.append("\n")

    def route(src, dst, links):
        return (
            [f'   <route src="{src}" dst="{dst}" symmetrical="NO">\n']
            + [f'      <link_ctn id="{link}"/>\n' for link in links]
            + ["   </route>\n"]
        )

    def bridge(k, direction):
        if not switches:
            return []
        j = m.switch_of(k)
        return [f"PCIe switch {j} {direction}", f"PCIe switch {j} through"]

    for k in range(g):
        out += route("RAM", f"CUDA{k}", [f"RAM-CUDA{k}"] + bridge(k, "down") + ["Host"])
        out += route(f"CUDA{k}", "RAM", [f"CUDA{k}-RAM"] + bridge(k, "up") + ["Host"])
    for a in range(g):
        for b in range(g):
            if a == b:
                continue
            if switches and m.switch_of(a) == m.switch_of(b):
                links = [f"CUDA{a}-RAM", f"PCIe switch {m.switch_of(a)} through", f"RAM-CUDA{b}"]
            else:
                links = [f"CUDA{a}-RAM"] + bridge(a, "up") + ["Host"] + bridge(b, "down")[::-1] + [f"RAM-CUDA{b}"]
            out += route(f"CUDA{a}", f"CUDA{b}", links)
    out += [
        "\n",
        " </AS>\n",
        " </platform>\n",
    ]
    return "".join(out)


def sim_env_file(m, cpu_workers):
    return (
        "# Generated by tools/gen-machine.py; read by tools/sim-env.sh.\n"
        f"STARPU_NCPU={cpu_workers}\n"
        f"STARPU_NCUDA={m.ngpus()}\n"
        f"STARPU_LIMIT_CUDA_MEM={int(m.gpu_mem.value) // MIB}\n"
    )


def machine_files(m, cpu_workers):
    """{relative path: content} of everything generated for machine m."""
    n = m.name
    files = {
        f"bus/{n}.platform.v4.xml": platform_file(m, cpu_workers),
        f"bus/{n}.bandwidth": bandwidth_file(m),
        f"bus/{n}.latency": latency_file(m),
        f"bus/{n}.config": config_file(m, cpu_workers),
        f"bus/{n}.affinity": affinity_file(m),
        "sim.env": sim_env_file(m, cpu_workers),
    }
    for c in CODELETS + MODEL_CODELETS:
        files[f"codelets/{PERFMODEL_VERSION}/{c.symbol}.{n}"] = perfmodel_file(m, c, cpu_workers)
    return files


# ---- the README's generated tables ----------------------------------------------------

README_BEGIN = "<!-- BEGIN tables generated by tools/gen-machine.py -->\n"
README_END = "<!-- END tables generated by tools/gen-machine.py -->\n"


def _fmt(num):
    v, u = num.value, num.unit
    if v is None:
        return "-"
    if u == "B/s":
        return f"{v / GB:.4g} GB/s"
    if u == "B":
        return f"{v / GIB:.4g} GiB" + (f" ({int(v) // MIB} MiB)" if v % MIB == 0 else "")
    if u == "s":
        return f"{v * 1e6:.3g} us"
    if u == "FLOP/s":
        return f"{v / 1e12:.4g} TFLOP/s" if v >= 1e12 else f"{v / 1e9:.4g} GFLOP/s"
    return f"{v:g}"


def _model_time_us(m, symbol, device, size):
    mc = next(c for c in MODEL_CODELETS if c.symbol == symbol)
    a, b, c = model_regression(m, mc, device, int(m.cpu_workers.value))
    return a * size**b + c


def _ms(us):
    return f"{us / 1e3:.3g} ms"


def readme_tables():
    rows = [
        ("cores", "physical cores of the rank"),
        ("cpu_workers", "simulated CPU workers W"),
        ("host_mem", "host memory"),
        ("host_bw", "host memory bandwidth reached by CPU Adam"),
        ("gpu_mem", "GPU memory (`memsize`, `STARPU_LIMIT_CUDA_MEM`)"),
        ("gpu_bw", "GPU HBM bandwidth reached by the kernels"),
        ("pcie_h2d", "PCIe host to device, sustained"),
        ("pcie_d2h", "PCIe device to host, sustained"),
        ("pcie_latency", "PCIe latency per transfer"),
        ("cpu_task_overhead", "fixed cost per CPU task"),
        ("gpu_task_overhead", "fixed cost per CUDA task"),
        ("cpu_sgemm_core", "fp32 SGEMM of one CPU core (model products)"),
        ("gpu_sgemm", "fp32 SGEMM of the GPU, no TF32 (model products)"),
        ("gpu_gemm16", "bf16/fp16 tensor-core products of the GPU, fp32 accumulation (16-bit compute)"),
    ]
    out = []
    for m in MACHINES.values():
        out.append(f"### `{m.name}`: {m.title}\n\n")
        out.append(f"CUDA0 model: {m.gpu_model}.\n\n")
        out.append("| quantity | value | status | source |\n|---|---|---|---|\n")
        node_rows = [
            ("gpus", "GPUs G, driven by one process"),
            ("sockets", "sockets"),
            ("gpus_per_switch", "GPUs per PCIe switch"),
            ("switch_h2d", "switch uplink, host to switch, sustained"),
            ("switch_d2h", "switch uplink, switch to host, sustained"),
        ]
        for field, label in rows + (node_rows if m.gpus else []):
            num = getattr(m, field)
            out.append(f"| {label} | {_fmt(num)} | {num.status} | {num.source} |\n")
        w = int(m.cpu_workers.value)
        s = 1e8
        adam = CODELETS[0]
        t_cpu = sum(regression(m, adam, CPU_WORKER, w)[i] * (adam.size(s) if i == 0 else 1) for i in (0, 2))
        t_gpu = sum(regression(m, adam, CUDA_WORKER, w)[i] * (adam.size(s) if i == 0 else 1) for i in (0, 2))
        state = 12 * s
        # The 20B setup per GPU: 5e9 params in subgroups of 1e8 on each GPU.
        all_cpu_params = f"{m.ngpus() * 5}e9 ({m.ngpus()} x 5e9)" if m.gpus else "5e9"
        out.append(
            f"\nWhat follows for a 1e8-param subgroup: CPU Adam {t_cpu / 1e3:.2f} ms per task with W = {w} "
            f"({m.host_bw.value / ADAM_BYTES / 1e9:.2f} G params/s in all); GPU Adam "
            f"{t_gpu / 1e3:.2f} ms; its 1.2 GB of state {state / m.pcie_h2d.value * 1e3:.1f} ms in and "
            f"{state / m.pcie_d2h.value * 1e3:.1f} ms out; all-CPU update of {all_cpu_params} params "
            f"{m.ngpus() * 50 * t_cpu / 1e6:.3f} s.\n\n"
        )
        # The 1b preset (n = 1024 tokens, d = 2048, F = 8192, H = 16, hd = 128, V = 50304).
        fc1 = 2 * 1024 * 2048 * 8192
        att = 4 * 1 * 16 * 1024 * 1024 * 128
        out.append(
            f"For the 1b preset's model codelets: its MLP up-projection ({fc1:.3g} FLOP) "
            f"{_ms(_model_time_us(m, 'dos_linear_fwd', CUDA_WORKER, fc1))} on the GPU, "
            f"{_ms(_model_time_us(m, 'dos_linear_fwd', CPU_WORKER, fc1))} on one CPU core; an attention "
            f"forward ({att:.3g} FLOP) {_ms(_model_time_us(m, 'dos_attention_fwd', CUDA_WORKER, att))} on the "
            f"GPU; an rmsnorm backward (25 MB) {_ms(_model_time_us(m, 'dos_rmsnorm_bwd', CUDA_WORKER, 25e6))} "
            f"on the GPU.\n\n"
        )
    out.append("Optimizer codelet perfmodels (same for every machine; time = a x size + c, size = bytes of data):\n\n")
    out.append("| symbol | data bytes per element (buffers) | traffic bytes per element | traffic counted |\n")
    out.append("|---|---|---|---|\n")
    for c in CODELETS:
        bufs = " + ".join(str(e) for e in c.vectors) + "".join(f" + {b} B once" for b in c.variables)
        out.append(f"| `{c.symbol}` | {c.size_per_element()} ({bufs}) | {c.traffic} | {c.traffic_note} |\n")
    out.append(
        "\nThe example model's codelets (time = a x size + c; size = floating-point operations from the "
        "perfmodel's `size_base`, or bytes of data; rate: the machine's `gpu_sgemm` or `cpu_sgemm_core` for "
        "sgemm, `gpu_gemm16` or `cpu_sgemm_core` x the 16-bit CPU factor for gemm16, times the attention "
        "efficiency for attention and attention16, `gpu_bw` or `host_bw` / W for bandwidth):\n\n"
    )
    out.append("| symbol | size | rate | GPU slowdown | what the size counts |\n|---|---|---|---|---|\n")
    for c in MODEL_CODELETS:
        unit = "FLOP" if c.size == FLOPS else "bytes"
        out.append(f"| `{c.symbol}` | {unit} | {c.rate} | {c.gpu_slowdown.value:g} | {c.what} |\n")
    out.append("\n| assumption | value | status | source |\n|---|---|---|---|\n")
    for label, num in (
        ("SGEMM efficiency", SGEMM_EFFICIENCY),
        ("attention efficiency", ATTENTION_EFFICIENCY),
        ("16-bit tensor-core efficiency", GEMM16_EFFICIENCY),
        ("16-bit products on the CPU", CPU_GEMM16_FACTOR),
    ):
        out.append(f"| {label} | {num.value:g} {num.unit} | {num.status} | {num.source} |\n")
    for c in MODEL_CODELETS:
        if c.gpu_slowdown is not NO_SLOWDOWN:
            g = c.gpu_slowdown
            out.append(f"| `{c.symbol}` GPU slowdown | x{g.value:g} | {g.status} | {g.source} |\n")
    out.append("\n### Networks between simulated nodes (`--cluster`, tools/sim-cluster.sh)\n\n")
    out.append("| network | what it is | bandwidth per node and direction | latency | sources |\n|---|---|---|---|---|\n")
    for n in NETWORKS.values():
        out.append(
            f"| `{n.name}` | {n.title} | {_fmt(n.bandwidth)} ({n.bandwidth.status}) | {_fmt(n.latency)} "
            f"({n.latency.status}) | {n.bandwidth.source}; {n.latency.source} |\n"
        )
    out.append(f"\nFabric ({FABRIC.status}): {FABRIC.source}. SMPI's own bandwidth and latency factors are set to 1 "
               f"({' '.join(f'`{o}`' for o in SMPI_OPTIONS)}): the numbers above are the sustained ones.\n")
    return "".join(out)


def updated_readme(text):
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"gen-machine: {README} lacks the generated-table markers")
    return text[: begin + len(README_BEGIN)] + "\n" + readme_tables() + "\n" + text[end:]


# ---- reading a real calibration -------------------------------------------------------


def read_calibration(directory):
    """Prints the table's numbers as measured by tools/device-check.sh (DIR is its output
    folder, or any STARPU_HOME or sampling folder): PCIe from StarPU's bus calibration, GPU
    memory from the platform file, GPU bandwidth from dos_adam's CUDA history, host
    bandwidth from dos-bench adam's all-core StarPU rows. The CPU perfmodels StarPU
    calibrated are single-core runs, not the all-core model used here: not copied."""
    import glob
    import re

    sampling = None
    candidates = [directory, os.path.join(directory, ".starpu", "sampling")]
    candidates.append(os.path.join(directory, "starpu-home", ".starpu", "sampling"))
    for cand in candidates:
        if glob.glob(os.path.join(cand, "bus", "*.bandwidth")):
            sampling = cand
            break
    if not sampling:
        print(f"gen-machine: no StarPU bus calibration (bus/*.bandwidth) under {directory}", file=sys.stderr)
        return 1
    for bw_path in sorted(glob.glob(os.path.join(sampling, "bus", "*.bandwidth"))):
        host = os.path.basename(bw_path)[: -len(".bandwidth")]
        print(f"# calibrated host '{host}' ({sampling})")

        def matrix(path):
            rows = []
            with open(path) as f:
                for line in f:
                    if not line.startswith("#"):
                        rows.append([float(x) for x in line.split()])
            return rows

        bw = matrix(bw_path)
        lat = matrix(os.path.join(sampling, "bus", host + ".latency"))
        if len(bw) > 1 and not math.isnan(bw[0][1]):
            print(f"pcie_h2d = {bw[0][1] * 1e6 / GB:.2f} GB/s   (StarPU bus calibration, NUMA 0 -> CUDA 0)")
            print(f"pcie_d2h = {bw[1][0] * 1e6 / GB:.2f} GB/s   (CUDA 0 -> NUMA 0)")
            print(f"pcie_latency = {(lat[0][1] + lat[1][0]) / 2:.2f} us   (mean of both directions)")
        else:
            print("no CUDA node in this bus calibration: PCIe not measured")
        xml = os.path.join(sampling, "bus", host + ".platform.v4.xml")
        if os.path.exists(xml):
            text = open(xml).read()
            cuda0 = r'<host id="CUDA0"[^>]*>\s*<prop id="model" value="([^"]*)"/>\s*<prop id="memsize" value="(\d+)"'
            for model, memsize in re.findall(cuda0, text):
                memsize = int(memsize)
                print(f"gpu_model = {model!r}; gpu_mem = {memsize} B = {memsize / MIB:.0f} MiB (totalGlobalMem)")
        adam = os.path.join(sampling, "codelets", str(PERFMODEL_VERSION), "dos_adam." + host)
        if os.path.exists(adam):
            device, best = None, {}
            lines = open(adam).read().splitlines()
            for i, line in enumerate(lines):
                if line.startswith("# device type"):
                    device = int(lines[i + 1])
                m = re.match(r"^[0-9a-f]{8}\t(\d+)\s+\S+\s+(\S+)", line)
                if m and device is not None:
                    size, mean = int(m.group(1)), float(m.group(2))
                    if size > best.get(device, (0, 0))[0]:
                        best[device] = (size, mean)
            if CUDA_WORKER in best:
                size, mean = best[CUDA_WORKER]
                nx = size / CODELETS[0].size_per_element()
                gbs = ADAM_BYTES * nx / (mean * 1e-6) / GB
                print(f"gpu_bw = {gbs:.1f} GB/s   (dos_adam CUDA history: {nx:.3g} params in {mean / 1e3:.3f} ms)")
            else:
                print("dos_adam has no CUDA history here: GPU bandwidth not measured")
    log = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(sampling))), "bench_adam.log")
    if os.path.exists(log):
        rows = []
        for line in open(log):
            f = line.split()
            if len(f) >= 5 and f[2] == "starpu" and f[0].isdigit() and f[1].isdigit():
                rows.append((int(f[0]), int(f[1]), float(f[4])))
        if rows:
            params, cores, gbs = max(rows)
            print(f"host_bw = {gbs:.2f} GB/s   (dos-bench adam, StarPU, {cores} cores, {params} params, 28 B/param)")
    return 0


# ---- main -------------------------------------------------------------------------------


def write_tree(out_dir, names, cpu_workers):
    for n in names:
        m = MACHINES[n]
        w = cpu_workers or int(m.cpu_workers.value)
        for rel, content in machine_files(m, w).items():
            path = os.path.join(out_dir, n, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write(content)


def check(names):
    """Compares the committed files with what this script generates now."""
    stale = []
    for n in names:
        m = MACHINES[n]
        for rel, content in machine_files(m, int(m.cpu_workers.value)).items():
            path = os.path.join(DEFAULT_OUT, n, rel)
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != content:
                stale.append(path)
                if current is not None:
                    diff = difflib.unified_diff(current.splitlines(True), content.splitlines(True), path, "generated")
                    sys.stdout.writelines(list(diff)[:40])
    with open(README, encoding="utf-8") as f:
        text = f.read()
    if updated_readme(text) != text:
        stale.append(README)
    for p in stale:
        print(f"gen-machine: out of date: {os.path.relpath(p, REPO)}", file=sys.stderr)
    return 1 if stale else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"machines (default: all of {', '.join(MACHINES)})")
    p.add_argument("--check", action="store_true", help="fail when the committed files differ from the generated ones")
    p.add_argument("--out", default=DEFAULT_OUT, help="where to write (default: sched/machines)")
    p.add_argument(
        "--cpu-workers",
        type=int,
        help="simulate W CPU workers, each task taking W times as long (experiments; needs --out elsewhere)",
    )
    p.add_argument("--read-calibration", metavar="DIR", help="print the numbers a real calibration measured")
    p.add_argument("--cluster", type=int, metavar="N", help="write DIR/cluster.xml and DIR/hostfile for N nodes (--out DIR)")
    p.add_argument("--network", default=DEFAULT_NETWORK, help=f"with --cluster: one of {', '.join(NETWORKS)}")
    args = p.parse_args()
    if args.read_calibration:
        return read_calibration(args.read_calibration)
    if args.cluster is not None:
        if args.cluster < 1 or args.network not in NETWORKS or os.path.abspath(args.out) == DEFAULT_OUT:
            print(
                f"gen-machine: --cluster {args.cluster} --network {args.network} --out {args.out}: needs N >= 1, "
                f"a network of {', '.join(NETWORKS)} and an --out other than sched/machines",
                file=sys.stderr,
            )
            return 2
        write_cluster(args.out, args.network, args.cluster)
        return 0
    names = args.names or list(MACHINES)
    unknown = [n for n in names if n not in MACHINES]
    if unknown:
        print(f"gen-machine: unknown machine {', '.join(unknown)}; known: {', '.join(MACHINES)}", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    if args.cpu_workers is not None and (args.cpu_workers < 1 or out == DEFAULT_OUT):
        print("gen-machine: --cpu-workers needs W >= 1 and an --out other than sched/machines", file=sys.stderr)
        return 2
    if args.check:
        return check(names)
    write_tree(out, names, args.cpu_workers)
    if out == DEFAULT_OUT:
        with open(README, encoding="utf-8") as f:
            text = f.read()
        new = updated_readme(text)
        if new != text:
            with open(README, "w", encoding="utf-8", newline="\n") as f:
                f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
