#!/usr/bin/env python3
"""Simulated machines for StarPU 1.4's SimGrid build, from one table of specifications.

MACHINES below is the one place where each machine's numbers live, every number with its
source. For each machine this script writes, under sched/machines/<name>/ (a directory laid
out like StarPU's own sampling directory):

  bus/<name>.platform.v4.xml   the SimGrid platform the simulator runs on
  bus/<name>.bandwidth, .latency, .config, .affinity
                               the bus model StarPU's schedulers predict with
  codelets/45/dos_adam.<name>, dos_cast.<name>, dos_grad_stats.<name>, dos_grad_scale.<name>
                               codelet perfmodels (CPU and CUDA), from bandwidth models
  sim.env                      the worker counts and GPU memory limit tools/sim-env.sh exports

and refreshes the generated tables in sched/machines/README.md. Output is deterministic (no
timestamps), so the generated files are committed and `--check` tells whether they are
current. Formats follow StarPU 1.4.10's writers byte for byte (perfmodel_bus.c,
perfmodel_history.c): see sched/machines/README.md for the pitfalls.

Usage: tools/gen-machine.py [--check] [--out DIR --cpu-workers W] [NAME...]
       tools/gen-machine.py --read-calibration DIR   (numbers for the table from a real run)
"""

import argparse
import difflib
import math
import os
import struct
import sys
from dataclasses import dataclass
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
                48, "cores", "assumption", "one rank's share of the node, as mission.md and the task brief describe it"
            ),
            cpu_workers=ONE_CPU_WORKER,
            host_mem=Num(None, "B", "unknown", "not published in our sources; the simulation does not use it"),
            host_bw=derived_host_bw(
                5e9, 2.27, "dos-algorithm.md: all-CPU step of the 20B model, one rank, ZeRO-3 log: 2271 ms"
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
                "dos-algorithm.md: GPU Adam ~100 G params/s on H100 (~1 ms per 1e8) x 28 B/param; "
                "0.84 of the 3.35 TB/s datasheet HBM3 bandwidth",
            ),
            pcie_h2d=Num(
                25 * GB,
                "B/s",
                "published",
                "dos-algorithm.md worked example: 25 GB/s each way (the logs' best setting sustained ~19 GB/s)",
            ),
            pcie_d2h=Num(25 * GB, "B/s", "published", "as H2D: PCIe is full duplex"),
            pcie_latency=PCIE_LATENCY,
            cpu_task_overhead=CPU_OVERHEAD,
            gpu_task_overhead=GPU_OVERHEAD,
        ),
        Machine(
            name="a100-pcie4",
            title="one rank of the published 4xA100-40GB node (DOS paper): 1 A100 40 GB, PCIe Gen4",
            gpu_model="NVIDIA A100-SXM4-40GB",
            cores=Num(None, "cores", "unknown", "not published in our sources; the CPU is modelled by its bandwidth"),
            cpu_workers=ONE_CPU_WORKER,
            host_mem=Num(None, "B", "unknown", "not published in our sources; the simulation does not use it"),
            host_bw=derived_host_bw(5e9, 5.20, "dos-algorithm.md: 4xA100 all-CPU step of the 20B model, 5.20 s"),
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
                "adam.md: ~4.3 TB/s device-to-device copy measured on this H200 (4.8 TB/s datasheet); "
                "GPU Adam assumed to reach it until dos_adam's CUDA model is calibrated",
            ),
            pcie_h2d=Num(
                50 * GB,
                "B/s",
                "estimate",
                "adam.md: ~50 GB/s per direction on Gen5 x16; replace with StarPU's bus calibration",
            ),
            pcie_d2h=Num(50 * GB, "B/s", "estimate", "as H2D: PCIe is full duplex"),
            pcie_latency=PCIE_LATENCY,
            cpu_task_overhead=CPU_OVERHEAD,
            gpu_task_overhead=GPU_OVERHEAD,
        ),
    ]
}


@dataclass(frozen=True)
class Codelet:
    symbol: str
    vectors: tuple  # element size of each vector buffer, in the task's buffer order
    variables: tuple  # byte size of each variable buffer, after the vectors
    traffic: int  # memory traffic per element, bytes
    traffic_note: str

    def size(self, nx):
        """Data size as StarPU computes it by default: the sum of the buffers' sizes."""
        return sum(e * nx for e in self.vectors) + sum(self.variables)

    def size_per_element(self):
        return sum(self.vectors)


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
]

# History entries: one per decade of subgroup sizes and one near the 32-bit limit of the
# codelets' element counts, each as if measured 10 times (StarPU's STARPU_CALIBRATE_MINIMUM).
# The regression is then valid (>= 10 samples, minx < 0.9 maxx: VALID_REGRESSION) and used
# for sizes within [0.9 minx, 1.1 maxx], i.e. 900 to 4.4e9 params; outside, StarPU looks
# the task's footprint up in the history, and the simulation aborts on a miss.
HISTORY_NX = [10**k for k in range(3, 10)] + [4 * 10**9]
SAMPLES_PER_ENTRY = 10

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
    return a, 1.0, overhead * 1e6


def _e(x):
    return "%-15e" % x


def perfmodel_block(machine, codelet, comb, device, cpu_workers):
    a, b, c = regression(machine, codelet, device, cpu_workers)
    entries = []
    for nx in sorted(HISTORY_NX, reverse=True):  # StarPU lists the newest entry first
        size = codelet.size(nx)
        mean = a * size**b + c
        entries.append((footprint(codelet, nx), size, mean))
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
    out.append("0\n")
    out.append("####################\n")
    out.append("# DEV_0\n")
    out.append("# number of cores \n")
    out.append("1\n")
    out.append("##########\n")
    out.append("# number of implementations\n")
    out.append("1\n")
    out.append("#####\n")
    out.append(f"# Model for {arch}0_impl0 (Comb{comb})\n")
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
        "2\n"
    )
    return (
        head
        + perfmodel_block(machine, codelet, 0, CPU_WORKER, cpu_workers)
        + perfmodel_block(machine, codelet, 1, CUDA_WORKER, cpu_workers)
    )


# ---- bus files --------------------------------------------------------------------------


def matrix_file(values):
    """values[src][dst] for nodes 0 (NUMA 0) and 1 (CUDA 0); written as StarPU's
    write_bus_{bandwidth,latency}_file_content does: a header with a trailing tab,
    MATRIX_NODES tab-separated columns (no trailing tab), nan outside the machine, then
    the all-nan rows."""
    out = ["# to NUMA 0\tto CUDA 0\t\n"]
    for src in range(MATRIX_NODES):
        row = []
        for dst in range(MATRIX_NODES):
            if src < 2 and dst < 2:
                row.append("%e" % values[src][dst])
            else:
                row.append("nan")
        out.append("\t".join(row) + "\n")
    return "".join(out)


def bandwidth_file(m):
    mb = 1e6  # StarPU's MB/s: bytes per microsecond
    return matrix_file([[0.0, m.pcie_h2d.value / mb], [m.pcie_d2h.value / mb, 0.0]])


def latency_file(m):
    us = m.pcie_latency.value * 1e6
    return matrix_file([[0.0, us], [us, 0.0]])


def config_file(cpu_workers):
    # write_bus_config_file_content; the CPU count is that of the simulated machine.
    lines = ["# Current configuration\n", f"{cpu_workers} # Number of CPUs\n"]
    kinds = [("NUMA", 1), ("CUDA", 1), ("OpenCL", 0), ("FPGA", 0), ("Disk", 0)]
    kinds += [("MPI_MS", 0), ("TCPIP_MS", 0), ("HIP", 0)]
    for kind, n in kinds:
        lines.append(f"{n} # Number of {kind} nodes\n")
    return "".join(lines)


def affinity_file():
    # write_bus_affinity_file_content: GPU 0 prefers NUMA node 0.
    return "# GPU\tNUMA0\t\n0\t0\t\n"


def platform_file(m, cpu_workers):
    """The SimGrid platform (format 4), laid out as StarPU 1.4.10's
    write_bus_platform_file_content writes it, with one change: the shared link is named
    "Host", as in StarPU's shipped examples and as simgrid.c's route counting expects
    (1.4.10's flat writer names it "Interconnect"). Both directions cross it, so its
    bandwidth is the sum of both: H2D and D2H each get their own link's bandwidth when
    they run together (full duplex), and share it when two go the same way."""
    h2d, d2h, lat = m.pcie_h2d.value, m.pcie_d2h.value, m.pcie_latency.value
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
    out += [
        '   <host id="CUDA0" speed="2000000000f">\n',
        f'     <prop id="model" value="{m.gpu_model}"/>\n',
        f'     <prop id="memsize" value="{int(m.gpu_mem.value)}"/>\n',
        '     <prop id="memcpy_peer" value="1"/>\n',
        "   </host>\n",
        "\n",
        '   <host id="RAM" speed="1f"/>\n',
        f'   <link id="Host" bandwidth="{h2d + d2h:f}Bps" latency="0.000000s"/>\n',
        "\n",
        f'   <link id="RAM-CUDA0" bandwidth="{h2d:f}Bps" latency="{lat:f}s"/>\n',
        f'   <link id="CUDA0-RAM" bandwidth="{d2h:f}Bps" latency="{lat:f}s"/>\n',
        "\n",
        '   <route src="RAM" dst="CUDA0" symmetrical="NO">\n',
        '      <link_ctn id="RAM-CUDA0"/>\n',
        '      <link_ctn id="Host"/>\n',
        "   </route>\n",
        '   <route src="CUDA0" dst="RAM" symmetrical="NO">\n',
        '      <link_ctn id="CUDA0-RAM"/>\n',
        '      <link_ctn id="Host"/>\n',
        "   </route>\n",
        "\n",
        " </AS>\n",
        " </platform>\n",
    ]
    return "".join(out)


def sim_env_file(m, cpu_workers):
    return (
        "# Generated by tools/gen-machine.py; read by tools/sim-env.sh.\n"
        f"STARPU_NCPU={cpu_workers}\n"
        "STARPU_NCUDA=1\n"
        f"STARPU_LIMIT_CUDA_MEM={int(m.gpu_mem.value) // MIB}\n"
    )


def machine_files(m, cpu_workers):
    """{relative path: content} of everything generated for machine m."""
    n = m.name
    files = {
        f"bus/{n}.platform.v4.xml": platform_file(m, cpu_workers),
        f"bus/{n}.bandwidth": bandwidth_file(m),
        f"bus/{n}.latency": latency_file(m),
        f"bus/{n}.config": config_file(cpu_workers),
        f"bus/{n}.affinity": affinity_file(),
        "sim.env": sim_env_file(m, cpu_workers),
    }
    for c in CODELETS:
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
    return f"{v:g}"


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
    ]
    out = []
    for m in MACHINES.values():
        out.append(f"### `{m.name}`: {m.title}\n\n")
        out.append(f"CUDA0 model: {m.gpu_model}.\n\n")
        out.append("| quantity | value | status | source |\n|---|---|---|---|\n")
        for field, label in rows:
            num = getattr(m, field)
            out.append(f"| {label} | {_fmt(num)} | {num.status} | {num.source} |\n")
        w = int(m.cpu_workers.value)
        s = 1e8
        adam = CODELETS[0]
        t_cpu = sum(regression(m, adam, CPU_WORKER, w)[i] * (adam.size(s) if i == 0 else 1) for i in (0, 2))
        t_gpu = sum(regression(m, adam, CUDA_WORKER, w)[i] * (adam.size(s) if i == 0 else 1) for i in (0, 2))
        state = 12 * s
        out.append(
            f"\nWhat follows for a 1e8-param subgroup: CPU Adam {t_cpu / 1e3:.2f} ms per task with W = {w} "
            f"({m.host_bw.value / ADAM_BYTES / 1e9:.2f} G params/s in all); GPU Adam "
            f"{t_gpu / 1e3:.2f} ms; its 1.2 GB of state {state / m.pcie_h2d.value * 1e3:.1f} ms in and "
            f"{state / m.pcie_d2h.value * 1e3:.1f} ms out; all-CPU update of 5e9 params "
            f"{50 * t_cpu / 1e6:.3f} s.\n\n"
        )
    out.append("Codelet perfmodels (same for every machine; time = a x size + c, size = bytes of data):\n\n")
    out.append("| symbol | data bytes per element (buffers) | traffic bytes per element | traffic counted |\n")
    out.append("|---|---|---|---|\n")
    for c in CODELETS:
        bufs = " + ".join(str(e) for e in c.vectors) + "".join(f" + {b} B once" for b in c.variables)
        out.append(f"| `{c.symbol}` | {c.size_per_element()} ({bufs}) | {c.traffic} | {c.traffic_note} |\n")
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
    args = p.parse_args()
    if args.read_calibration:
        return read_calibration(args.read_calibration)
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
