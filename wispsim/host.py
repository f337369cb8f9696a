"""The CPU a measurement ran on, and the one line that says when it is not this one.

A profile measured on a CPU engine holds only for CPUs like the one that measured it: the same
vLLM CPU backend ran 1.8x slower per batch on an AVX2 host than on an AVX-512 one. ``profile
record`` stores :func:`cpu_facts` in the recording's sidecar, ``profile fit`` copies them into
the profile's ``provenance.host`` (and ``wispsim serve`` reports them in its facts, so a fit of
a deployment's batch log names the server's host); ``replay``, ``validate`` and ``serve`` print
:func:`host_note` when they differ from the host the real timings come from. A profile whose host
is not recorded gets no note.
"""

from __future__ import annotations

import os
import platform
from typing import Any

ISA_LEVELS = ("avx512", "avx2", "other")


def isa_level(flags: set[str] | frozenset[str]) -> str:
    """The vector ISA level that matters to CPU inference kernels, from ``/proc/cpuinfo`` flags."""
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "other"


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model name and ISA level from the text of ``/proc/cpuinfo`` (empty if it names none)."""
    model, flags = "", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and flags is None:
            flags = frozenset(value.split())
    out: dict[str, Any] = {}
    if model:
        out["cpu"] = model
    if flags is not None:
        out["isa"] = isa_level(flags)
    return out


def cpu_facts() -> dict[str, Any]:
    """This host's CPU: model name, logical core count and ISA level (``/proc/cpuinfo``; where
    there is none, py-cpuinfo if it is installed, else the platform's processor name)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", errors="replace") as fh:
            facts |= parse_cpuinfo(fh.read())
    except OSError:
        try:
            import cpuinfo  # py-cpuinfo, when some other package brought it

            info = cpuinfo.get_cpu_info()
            facts["cpu"] = str(info.get("brand_raw") or "")
            facts["isa"] = isa_level(frozenset(info.get("flags") or ()))
        except Exception:  # not installed, or it could not tell
            pass
    facts["cpu"] = facts.get("cpu") or platform.processor() or "unknown CPU"
    return facts


def _same(a: Any, b: Any) -> bool:
    return " ".join(str(a).lower().split()) == " ".join(str(b).lower().split())


def _label(host: dict[str, Any]) -> str:
    return f"{host.get('cpu', 'an unknown CPU')} ({host.get('isa', 'ISA not recorded')})"


def host_note(profile: str, measured: dict[str, Any] | None, here: dict[str, Any]) -> str | None:
    """One line when ``profile`` was measured on a CPU host (``measured``: its
    ``provenance.host``) whose ISA level or model differs from ``here``; None when they agree,
    when the profile was measured on a GPU, or when its host is not recorded."""
    if not measured or measured.get("gpu"):
        return None
    differs = [
        key
        for key in ("isa", "cpu")
        if measured.get(key) and here.get(key) and not _same(measured[key], here[key])
    ]
    if not differs:
        return None
    return (
        f"note: profile {profile} was measured on {_label(measured)}; this host is {_label(here)}: "
        "real timings may differ; `wispsim profile fit` on a recording from this host fixes it"
    )
