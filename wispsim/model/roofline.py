"""The physical cost of a forward pass: the ``roofline`` estimator form (SPEC 4, "physics first").

A pass over a batch (one verification batch, one decode step, one prefill chunk, or a mix) on one
replica of ``tp`` GPUs (tensor parallel: each GPU holds 1/tp of every weight, KV head and FLOP)
costs, per GPU::

    T = step                                                   per-step overhead
      + W(n) / (B * e_bw)  (+)  (F_lin * N_linear + F_head * N_logits) / (P * e_flop)   linear layers
      + min(grouped, one by one)                                       routed experts (MoE)
      + kv * (N_cached + N_linear) / (B * e_bw)  (+)  F_att * N_interactions / (P * e_att)
      + MLA's prefills: their pairs at F_pre, not F_att; their cached context projected up
        (U_bytes / (B * e_bw)  (+)  F_up / (P * e_flop)) per N_prefill_cached
      + TP all-reduces: 2 x layers x (latency + 2 (tp - 1) / tp x bytes of N_linear activations
                                      / (link x e_link))
      + layers x (GEMMs x matmul + groups x elementwise floor)     kernels' fixed latencies
      + activation_passes x 2 (hidden + intermediate / tp) x bytes x N_linear / (B * e_bw)
      + sampler x vocabulary x N_logits / (B * e_bw)                  greedy sampling
      + request * N_requests + arrival * N_arrivals

- ``W(n)``: the matmul weights the pass reads, once, at the weights' dtype (all of a dense model;
  of a mixture of experts, all but its routed experts); ``X(n)``: the routed experts its n tokens
  are sent to. An engine runs them the faster of two ways (timed on an H200:
  wispsim.study.expert_kernels): ``grouped`` = 2 x MoE layers x grouped kernel +
  X(n) / (B * e_xbw) (+) F_x * N_linear / (P * e_xflop), one launch per projection for every
  expert's few rows, reaching less of the GPU than a dense GEMM (``e_xbw``, ``e_xflop``: the
  generation's dense figures times measured ratios); ``one by one`` = 3 x MoE layers x experts
  reached x matmul + X(n) / (B * e_bw) (+) F_x * N_linear / (P * e_flop), a dense GEMM pair and
  activation per expert. Many small experts run grouped, a few large ones (Mixtral) one by one;
- ``F_lin``: 2 x the matmul weights one token passes through but the LM head, ``F_x`` its routed
  experts' share (F_lin here excludes it); ``F_head``: 2 x vocabulary x hidden size, the LM head
  over one of the ``N_logits`` rows it computes (:class:`~wispsim.model.batch.Shape`: every new
  token of a verification round, one per request of a generation step -- vLLM computes logits
  only at ``logits_indices``, not at the prompt tokens a prefill chunk forwards); ``F_att``: 4 x
  layers x heads x head_dim per query-key pair (QK^T and AV); ``kv``: 2 x layers x KV heads x
  head_dim x KV bytes (MLA: its absorbed decode form and cached latent; :class:`wispsim.model.archs.Arch`);
  ``F_pre``, ``F_up``, ``U_bytes``: MLA's expanded prefill form, the FLOPs of projecting a cached
  token's latent up to every head's key and value and their bytes, written and read
  (:attr:`Arch.prefill_attention`), for the members with more new tokens than the attention
  backend decodes (``reorder_batch_threshold``; docs/model.md, "Latent attention's two forms");
- ``B``, ``P``: the GPU's datasheet HBM bandwidth and dense tensor-core peak at the precision;
  ``e_bw``, ``e_flop``, ``e_att`` (<= 1): the fractions of them real kernels reach (fitted);
  weight-only quantized layers (and experts) multiply at ``e_flop`` times their mixed-input
  kernel's measured ratio (``dequant``, ``expert_dequant``: the weights are converted to 16 bits
  inside each GEMM; :mod:`wispsim.model.weight_only`), and read their bytes at ``e_bw``;
- ``x (+) y = (x^p + y^p)^(1/p)``: how far a kernel overlaps its memory traffic with its math,
  ``p = overlap`` >= 1 (fitted). The ideal roofline is ``p = inf`` (the slower of the two); real
  GEMMs at a few hundred tokens are slower than either alone, so a prefill mixed into a
  weight-bound decode step is not free;
- ``matmul``: a matmul kernel's fixed latency (launch, ramp-up, tail), per GEMM a layer launches
  (four in a dense GQA layer; latent attention and MoE routing add theirs:
  :meth:`wispsim.model.archs.Arch.kernel_latency`);
  ``elementwise floor``: the least a layer's elementwise kernels (norms, rotary embedding,
  activation, residual adds) take; ``activation_passes``: how many times they stream a token's
  activations. All three are kernel facts of the GPU's generation (wispsim/data/efficiency.yaml,
  fitted by :mod:`wispsim.study.gpu_kernels` on public and recorded kernel timings), as are
  ``e_bw``, ``e_flop`` and ``p``;
- all-reduce ``latency``: the engine's own all-reduce's (vLLM's custom all-reduce or symmetric
  memory) for a message of at most its size limit, NCCL's beyond; ``e_link``: the fraction of the
  link's datasheet bandwidth NCCL's ring reaches, by GPU count (Vidur's public measurements,
  :mod:`wispsim.study.allreduce_fit`; wispsim/data/interconnects.yaml);
- ``sampler``: bytes per logit vLLM's sampler moves on its greedy path, outside the forward
  (``SAMPLER_BYTES_PER_LOGIT``: the LM head's bf16 logits written, read and written again as
  fp32, read by the argmax; vLLM ``v1/sample/sampler.py``), over the whole vocabulary on every
  GPU of the replica (the logits are all-gathered). Sampling at a temperature (a softmax, top-k /
  top-p, a sort) moves more and is not modelled;
- ``step``: what the engine spends per step besides the GPU's work (scheduling, input
  preparation, kernel launches not hidden by CUDA graphs, sampling); ``request``: per request in
  the pass (its input rows, sampling, streaming its output); ``arrival``: engine work per request
  *arriving anew* (admission, block allocation, prefix-cache lookup, adding it to the persistent
  batch): every verification round of edge drafting is a new request re-submitted with its
  prefix, a running sequence's next decode step is not. Fitted.
- ``frontend`` (stored beside these, fitted with them on TTFT at low load) is not GPU time: the
  latency a request spends in the API server (HTTP, tokenization) before the engine sees it, in
  parallel with the engine's steps. It is a fact of the host, so it is not part of this form: the
  profile keeps it (:class:`wispsim.model.host_cpu.HostFacts`) and the server's front charges it
  (:mod:`wispsim.sim.front`).

Each part is at least the larger of (bytes / bandwidth, FLOPs / peak) (``x (+) y >= max(x, y)``
for ``p >= 1``), with efficiencies <= 1 and non-negative overheads, so a pass is never priced
below its physical floor
``max(total bytes / B, total FLOPs / P)`` (:meth:`Roofline.floor`; property-tested over every
shipped GPU and architecture). What is not modelled is written down in docs/model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wispsim.model.archs import Arch
from wispsim.model.cost import AggregateCost

# parameters a roofline profile fits, with their documented defaults and allowed ranges
EFFICIENCIES = (
    "bandwidth", "compute", "attention", "expert_bandwidth", "expert_compute", "link",
    "dequant", "expert_dequant",
)  # fmt: skip
# seconds; ``allreduce`` per all-reduce; ``frontend`` is latency, not GPU time: the profile's host
# facts take it (module docstring)
OVERHEADS = ("step", "request", "arrival", "allreduce", "allreduce_nccl", "frontend")
ALLREDUCE_LATENCY_S = 8e-6  # one small-message all-reduce over NVLink (order of vLLM's custom all-reduce)
OVERLAP_RANGE = (1.0, 64.0)  # ``overlap``: 1 = memory and math add up; beyond 64 it is the max
# bytes per logit of vLLM's greedy sampler (module docstring): bf16 out of the LM head (2), read
# and cast to fp32 (2 + 4), read by the argmax (4)
SAMPLER_BYTES_PER_LOGIT = 2 + 2 + 4 + 4


def combine(memory: float, math_: float, p: float) -> float:
    """``memory (+) math``: the p-norm of the two times (module docstring); the max for p = inf."""
    if p == math.inf:
        return memory if memory >= math_ else math_
    hi = memory if memory >= math_ else math_
    if hi <= 0.0:
        return 0.0
    lo = (memory + math_ - hi) / hi
    return hi * (1.0 + lo**p) ** (1.0 / p)


@dataclass(frozen=True, slots=True)
class Roofline(AggregateCost):
    """The ``roofline`` form, built from an architecture, a GPU and a few fitted parameters
    (module docstring). Per-GPU quantities: the replica's ``tp`` GPUs share the work evenly.
    The per-unit times are computed once (``__post_init__``): the scheduler prices a batch per
    candidate request."""

    arch: Arch
    tp: int
    weight_dtype_bytes: int
    kv_dtype_bytes: int
    bandwidth: float  # B/s per GPU (datasheet peak)
    peak_flops: float  # FLOP/s per GPU (datasheet dense peak at the precision)
    link_bandwidth: float  # B/s per GPU, one direction (all-reduces); inf for tp = 1
    bandwidth_eff: float = 0.8
    compute_eff: float = 0.6
    attention_eff: float = 0.6
    overlap: float = math.inf
    step: float = 0.0
    request: float = 0.0
    arrival: float = 0.0
    allreduce: float = ALLREDUCE_LATENCY_S  # seconds: the engine's own all-reduce (small messages)
    allreduce_nccl: float | None = None  # seconds: NCCL's, beyond the fast path; None: ``allreduce``
    link_eff: float = 1.0  # the fraction of link_bandwidth an all-reduce reaches
    allreduce_fast_bytes: float = math.inf  # the largest message the engine's own all-reduce takes
    activation_bytes: int = 2  # all-reduced activations are bf16
    matmul_kernel: float = 0.0  # seconds: a matmul kernel's fixed latency, four per layer
    elementwise_floor: float = 0.0  # seconds per layer: the least its elementwise kernels take
    activation_passes: float = 0.0  # how often elementwise kernels stream a token's activations
    # routed experts' grouped GEMMs (wispsim.study.expert_kernels); None: the dense figures
    expert_bandwidth_eff: float | None = None
    expert_compute_eff: float | None = None
    expert_kernel: float | None = None  # seconds per grouped GEMM, two per MoE layer
    # mixed-input GEMMs of weight-only quantized layers and experts: the fraction of the dense
    # compute figure they reach (wispsim.model.weight_only; 1: nothing converts, or not measured)
    dequant_eff: float = 1.0
    expert_dequant_eff: float = 1.0
    # W8A8 layers on the GPU's own 8-bit tensor cores: their FLOP rate over the profile's dense
    # GEMMs' (wispsim.model.weight_only.quantized_rate; 1: none, or an fp8 profile already)
    quant_rate: float = 1.0
    # the most new tokens of a member the attention backend decodes (vLLM's reorder_batch_threshold;
    # wispsim.model.attention): MLA prices the rest in its prefill form (Arch.prefill_attention)
    reorder_batch_threshold: int = 1
    form: str = "roofline"
    # seconds per unit, derived in __post_init__
    _weights_s: float = field(init=False, repr=False, compare=False)  # dense weight read (0: a mixture)
    _token_s: float = field(init=False, repr=False, compare=False)  # linear FLOPs of one token
    # the LM head's part of them, over one logit row: a token with no logit row saves it
    _head_s: float = field(init=False, repr=False, compare=False)
    _sample_s: float = field(init=False, repr=False, compare=False)  # greedy sampling, one logit row
    _xtoken_s: float = field(init=False, repr=False, compare=False)  # its routed experts' FLOPs
    _xdense_s: float = field(init=False, repr=False, compare=False)  # the same at the dense efficiency
    _xbw: float = field(init=False, repr=False, compare=False)  # B/s the grouped experts reach
    _dense_w_s: float = field(init=False, repr=False, compare=False)  # a mixture's non-routed weights
    _expert_bytes: float = field(init=False, repr=False, compare=False)  # bytes per expert reached
    _kv_s: float = field(init=False, repr=False, compare=False)  # KV of one token
    _qflops: float = field(init=False, repr=False, compare=False)  # FLOPs at quant_rate, per token
    _pair_s: float = field(init=False, repr=False, compare=False)  # one query-key interaction
    _ppair_d: float = field(init=False, repr=False, compare=False)  # a prefill's pair less a decode's
    _ctx_s: float = field(init=False, repr=False, compare=False)  # MLA: a prefill's context, FLOPs
    _ctx_bw: float = field(init=False, repr=False, compare=False)  # and its keys and values' bytes
    _ar_fixed_s: float = field(init=False, repr=False, compare=False)  # all-reduce latencies per pass
    _ar_nccl_s: float = field(init=False, repr=False, compare=False)  # the same beyond the fast path
    _ar_fast_n: float = field(init=False, repr=False, compare=False)  # tokens the fast path takes
    _ar_token_s: float = field(init=False, repr=False, compare=False)  # all-reduce bytes of one token
    _kernels_s: float = field(init=False, repr=False, compare=False)  # fixed kernel latencies per pass
    _act_s: float = field(init=False, repr=False, compare=False)  # elementwise traffic of one token

    def __post_init__(self) -> None:
        bw = self.bandwidth * self.bandwidth_eff
        dense = self.arch.experts <= 1 or not self.arch.moe_layers
        per_token = self.arch.hidden_size * self.activation_bytes * 2 * (self.tp - 1) / self.tp
        routed_flops = 0.0 if dense else 2.0 * self.arch.routed_params_per_token / self.tp
        x_eff = self.compute_eff if self.expert_compute_eff is None else self.expert_compute_eff
        x_bw = self.bandwidth * (
            self.bandwidth_eff if self.expert_bandwidth_eff is None else self.expert_bandwidth_eff
        )
        one = self.arch.routed_bytes_read(1, self.weight_dtype_bytes) / self.tp  # k experts per layer
        per_expert = 0.0 if dense else one / self.arch.touched_experts(1)
        nccl = self.allreduce if self.allreduce_nccl is None else self.allreduce_nccl
        rate = self.peak_flops * self.compute_eff  # dense GEMMs' FLOP/s
        whole = self.arch.quant_scope == "linear"  # every linear layer quantized, not just experts
        q_lin = self.dequant_eff * (self.quant_rate if whole else 1.0)
        q_x = self.expert_dequant_eff * (self.quant_rate if self.arch.quant_method else 1.0)
        head_s = self.head_flops / (rate * (q_lin if self.arch.quant_head else 1.0))
        pre_pair, up_flops, up_values = self.arch.prefill_attention
        values = {
            "_expert_bytes": per_expert,  # one expert reached in every MoE layer, per GPU
            "_weights_s": self.weight_bytes_read(1) / bw if dense else 0.0,
            "_dense_w_s": 0.0 if dense else (self.weight_bytes_read(1) - one) / bw,
            "_xbw": x_bw,
            "_token_s": (self.linear_flops - routed_flops) / rate  # the same bits as before quantization
            if q_lin == 1.0
            else (self.linear_flops - routed_flops - self.head_flops) / (rate * q_lin) + head_s,
            "_head_s": head_s,
            "_sample_s": SAMPLER_BYTES_PER_LOGIT * self.arch.head_vocab / bw,
            "_xtoken_s": routed_flops / (self.peak_flops * x_eff * q_x),
            "_xdense_s": routed_flops / (rate * q_x),
            # FLOPs per token of the layers a W8A8 checkpoint runs on its 8-bit tensor cores
            "_qflops": (
                (self.linear_flops - (0.0 if self.arch.quant_head else self.head_flops)) * whole
                + routed_flops * (not whole)
            )
            if self.quant_rate != 1.0
            else 0.0,
            "_act_s": self.activation_passes * self.act_bytes / bw,
            # a mixture's routed-expert GEMMs are priced with them (batch), not here
            "_kernels_s": self.arch.kernel_latency(self.matmul_kernel, self.elementwise_floor, not dense),
            "_kv_s": self.kv_bytes / bw,
            "_pair_s": self.attention_flops / (self.peak_flops * self.attention_eff),
            "_ppair_d": (pre_pair - self.arch.attention_flops_per_interaction)
            / (self.tp * self.peak_flops * self.attention_eff),
            "_ctx_s": up_flops / (self.tp * rate * q_lin),  # kv_b_proj, a linear layer
            "_ctx_bw": 2 * up_values * self.activation_bytes / (self.tp * bw),  # written, then read
            "_ar_fixed_s": 2 * self.arch.layers * self.allreduce if self.tp > 1 else 0.0,
            "_ar_nccl_s": 2 * self.arch.layers * nccl if self.tp > 1 else 0.0,
            "_ar_fast_n": self.allreduce_fast_bytes / (self.arch.hidden_size * self.activation_bytes),
            "_ar_token_s": (
                2 * self.arch.layers * per_token / (self.link_bandwidth * self.link_eff)
                if self.tp > 1
                else 0.0
            ),
        }
        for k, v in values.items():
            object.__setattr__(self, k, v)

    # --- what the hardware allows ---------------------------------------------------------
    def weight_bytes_read(self, n_linear: float) -> float:
        """Bytes of weights one GPU reads in a pass over ``n_linear`` tokens (quantized layers at
        their bits: :meth:`Arch.matmul_bytes_read`)."""
        return self.arch.matmul_bytes_read(n_linear, self.weight_dtype_bytes) / self.tp

    def routed_bytes_read(self, n_linear: float) -> float:
        """The routed experts' part of :meth:`weight_bytes_read` (0 for a dense model): linear in
        the experts the pass reaches (:meth:`Arch.routed_bytes_read`)."""
        return self._expert_bytes * self.arch.touched_experts(n_linear) if self._expert_bytes else 0.0

    @property
    def act_bytes(self) -> float:
        """Bytes of one token's activations through one GPU's elementwise kernels, all layers
        (hidden and MLP width, each read and written once per pass)."""
        mlp = self.arch.mlp_width_per_token
        per_layer = 2 * (self.arch.hidden_size + mlp / self.tp)
        return self.arch.layers * per_layer * self.activation_bytes

    @property
    def linear_flops(self) -> float:
        """FLOPs per new token through the linear layers, per GPU."""
        return self.arch.linear_flops_per_token / self.tp

    @property
    def head_flops(self) -> float:
        """FLOPs of the LM head per logit row, per GPU (vLLM splits its vocabulary over the
        ``tp`` GPUs); part of :attr:`linear_flops`, which counts it for every new token."""
        return 2.0 * self.arch.head_vocab * self.arch.hidden_size / self.tp

    @property
    def attention_flops(self) -> float:
        """FLOPs per query-key interaction, per GPU."""
        return self.arch.attention_flops_per_interaction / self.tp

    @property
    def kv_bytes(self) -> float:
        """KV bytes per cached token, per GPU: KV heads replicated where tp exceeds them, MLA's
        latent whole on each GPU (:meth:`Arch.kv_bytes_per_gpu`). Sliding-window layers count in
        full here: a shape formed under a :class:`~wispsim.model.batch.Window` has capped them
        per sequence in its sums already."""
        return float(self.arch.kv_bytes_per_gpu(self.kv_dtype_bytes, self.tp))

    def floor(self, n_linear: float, n_interactions: float, n_cached: float, n_logits: float | None = None,
              n_prefill_interactions: float = 0, n_prefill_cached: float = 0) -> float:  # fmt: skip
        """The physical floor of a pass: its bytes at peak bandwidth or its FLOPs at peak,
        whichever is slower (weights once, KV of every token attended to, the LM head over the
        ``n_logits`` rows it computes, unsaid every new token; MLA's prefills in their form)."""
        if n_linear <= 0:
            return 0.0
        skipped = 0.0 if n_logits is None else n_linear - n_logits  # new tokens without a logit row
        pre_pair, up_flops, up_values = self.arch.prefill_attention
        byts = self.weight_bytes_read(n_linear) + self.kv_bytes * (n_cached + n_linear)
        byts += 2 * up_values * self.activation_bytes / self.tp * n_prefill_cached
        flops = (
            self.linear_flops * n_linear - self.head_flops * skipped + self.attention_flops * n_interactions
        )
        flops += (pre_pair - self.arch.attention_flops_per_interaction) / self.tp * n_prefill_interactions
        up = up_flops / self.tp * n_prefill_cached  # kv_b_proj's, quantized with the linear layers
        flops += up
        if not self._qflops:
            return max(byts / self.bandwidth, flops / self.peak_flops)
        fast = self._qflops * n_linear - (self.head_flops * skipped if self.arch.quant_head else 0.0)
        fast += up if self.arch.quant_scope == "linear" else 0.0
        return max(byts / self.bandwidth, (flops - fast + fast / self.quant_rate) / self.peak_flops)

    # --- the cost interface (wispsim.model.cost) --------------------------------------------
    def batch(self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float = 0,
              n_arrivals: float = 0, n_logits: float | None = None, n_prefill_interactions: float = 0,
              n_prefill_cached: float = 0) -> float:  # fmt: skip
        """``T_hat`` of a pass from the batch's aggregates (module docstring; ``n_logits``
        unsaid: every new token; the prefill sums unsaid: every member decodes). The
        :func:`combine` calls are written out: the scheduler prices a batch per candidate."""
        p = self.overlap
        w = self._weights_s or self._dense_w_s
        logits = n_linear if n_logits is None else n_logits
        f = self._token_s * n_linear
        if logits != n_linear:  # tokens without a logit row skip the head
            f -= self._head_s * (n_linear - logits)
        hi = w if w >= f else f
        if p != math.inf and hi > 0.0:
            hi = hi * (1.0 + ((w + f - hi) / hi) ** p) ** (1.0 / p)
        if self._xtoken_s:
            hi += self.routed_experts(n_linear)
        k = self._kv_s * (n_cached + n_linear)
        q = self._pair_s * n_interactions
        if n_prefill_interactions and self._ppair_d:  # MLA's prefills: their own form
            q += self._ppair_d * n_prefill_interactions
        a_hi = k if k >= q else q
        if p != math.inf and a_hi > 0.0:
            a_hi = a_hi * (1.0 + ((k + q - a_hi) / a_hi) ** p) ** (1.0 / p)
        if n_prefill_cached and self._ctx_s:  # and their cached context projected up
            a_hi += combine(self._ctx_bw * n_prefill_cached, self._ctx_s * n_prefill_cached, p)
        return (
            self.step
            + self._kernels_s
            + hi
            + a_hi
            + (self._ar_fixed_s if n_linear <= self._ar_fast_n else self._ar_nccl_s)
            + (self._ar_token_s + self._act_s) * n_linear
            + self._sample_s * logits
            + self.request * n_requests
            + self.arrival * n_arrivals
        )

    def routed_experts(self, n_linear: float) -> float:
        """A mixture's routed experts in a pass over ``n_linear`` tokens: the faster of one grouped
        kernel per projection (two per MoE layer, at the grouped figures) and one dense GEMM pair
        and activation kernel per expert reached (three launches each, at the dense figures), as
        timed on an H200 (wispsim.study.expert_kernels): few large experts run best one by one,
        many small ones grouped."""
        p, layers, reached = self.overlap, self.arch.moe_layers, self.arch.touched_experts(n_linear)
        x = self._expert_bytes * reached
        kernel = self.matmul_kernel if self.expert_kernel is None else self.expert_kernel
        grouped = 2 * layers * kernel + combine(x / self._xbw, self._xtoken_s * n_linear, p)
        launches = 3 * layers * reached * self.matmul_kernel
        one_by_one = launches + combine(
            x / (self.bandwidth * self.bandwidth_eff), self._xdense_s * n_linear, p
        )
        return min(grouped, one_by_one)

    def allreduce_time(self, n_linear: float) -> float:
        """Two all-reduces per layer (after attention and after the MLP) of the pass's
        activations, ring algorithm: each GPU sends and receives 2 (tp - 1) / tp of them at
        ``link_eff`` of the link; a message the engine's own all-reduce takes (at most
        ``allreduce_fast_bytes``) pays its latency, a larger one NCCL's."""
        fixed = self._ar_fixed_s if n_linear <= self._ar_fast_n else self._ar_nccl_s
        return fixed + self._ar_token_s * n_linear

    def marginal(self, l_new: int, l_cached: int) -> float:
        """What one request adds to a large batch (the scheduler's ``v_i``): its tokens through
        the linear layers at the compute rate, its attention, its share of the all-reduces' bytes,
        the sampling of its logit rows (a verification round's: every new token) and the
        per-request and arrival overheads. The weight read and the all-reduces' latency
        (the fast path's or NCCL's, by the batch's message size) are the batch's, not the
        request's."""
        q = self._pair_s * l_new * (l_new + l_cached)
        prefill = l_new > self.reorder_batch_threshold
        if prefill and self._ppair_d:  # MLA's prefill form
            q += self._ppair_d * l_new * (l_new + l_cached)
        attention = combine(self._kv_s * (l_cached + l_new), q, self.overlap)
        if prefill and self._ctx_s and l_cached:
            attention += combine(self._ctx_bw * l_cached, self._ctx_s * l_cached, self.overlap)
        return (
            (self._token_s + self._xtoken_s + self._ar_token_s + self._act_s + self._sample_s) * l_new
            + attention
            + self.request
            + self.arrival
        )

    @property
    def prefill_above(self) -> int:
        return self.reorder_batch_threshold

    @property
    def fastest(self) -> float:
        """The cheapest pass there is: one new token, nothing cached, one running request."""
        return self.batch(1, 1, 0, 1, 0)
