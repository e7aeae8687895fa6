"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 3) over packed batches.

One forward takes every scheduled token of the step — prefill chunks and decode tokens
mixed — with their positions and a slot mapping into the paged KV cache. Projections are
fused (qkv, gate+up) so each layer runs a handful of large matmuls for the whole batch.
Only the rows that need a next token go through the final norm and the LM head.

Gemma 3 is the same decoder with four norms a layer, a GELU MLP, scaled embeddings and five of
every six layers attending through a sliding window with their own rope base (a second rope
table; the C++ attention kernels take the window in their portable loops).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pacer.model.attention import AttentionMetadata, paged_attention, write_kv
from pacer.model.checkpoint import ModelArch
from pacer.model.kernels import forced_isa
from pacer.model.kv_quant import KVFormat, kv_format
from pacer.model.linear import Linear
from pacer.model.quant import QuantLinear, QuantWeight

Proj = Linear | QuantLinear
_TILED_HEAD_DIMS = (64, 128)   # the C++ prefill kernel's vectorised tiles (csrc/prefill_attention.cpp)

__all__ = ["LlamaModel", "rope_inv_freq"]


def rope_inv_freq(arch: ModelArch, local: bool = False) -> torch.Tensor:
    """Inverse frequencies, with llama3 / linear scaling applied as HF transformers does.
    `local`: the sliding layers' (their own base when the arch names one, never scaled)."""
    d = arch.head_dim
    theta = arch.rope_local_theta if local and arch.rope_local_theta else arch.rope_theta
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = {} if local else arch.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind in ("default", None):
        return inv.float()
    if kind == "linear":
        return (inv / float(rs["factor"])).float()
    if kind == "llama3":
        factor = float(rs["factor"])
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_len = float(rs["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled).float()
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


class _Layer:
    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down", "q_norm", "k_norm", "pre_ffn_norm",
                 "post_ffn_norm", "window", "rope")

    def __init__(self, t: dict[str, torch.Tensor], i: int, arch: ModelArch, dtype: torch.dtype,
                 device: torch.device, linear_backend: str, quantized: dict[str, QuantWeight],
                 quant_activations: str) -> None:
        p = f"model.layers.{i}."

        def w(name: str) -> torch.Tensor:
            return t[p + name].to(device=device, dtype=dtype).contiguous()

        def proj(names: tuple[str, ...], bias: torch.Tensor | None = None) -> Proj:
            """One (fused) projection: packed when every part is quantized, else float."""
            keys = [f"{p}{n}.weight" for n in names]
            if all(k in quantized for k in keys):
                return QuantLinear(QuantWeight.cat([quantized[k] for k in keys]), bias, quant_activations)
            return Linear(torch.cat([w(f"{n}.weight") for n in names]), bias, linear_backend)

        self.in_norm = w("input_layernorm.weight")
        self.post_norm = w("post_attention_layernorm.weight")
        qkv_b = None
        if arch.attention_bias:
            qkv_b = torch.cat([w("self_attn.q_proj.bias"), w("self_attn.k_proj.bias"),
                               w("self_attn.v_proj.bias")]).contiguous()
        self.qkv = proj(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), qkv_b)
        self.o = proj(("self_attn.o_proj",))
        self.gate_up = proj(("mlp.gate_proj", "mlp.up_proj"))
        self.down = proj(("mlp.down_proj",))
        self.q_norm = w("self_attn.q_norm.weight") if arch.qk_norm else None
        self.k_norm = w("self_attn.k_norm.weight") if arch.qk_norm else None
        # sandwich norms (gemma): post_norm follows attention, these two wrap the MLP
        self.pre_ffn_norm = w("pre_feedforward_layernorm.weight") if arch.sandwich_norms else None
        self.post_ffn_norm = w("post_feedforward_layernorm.weight") if arch.sandwich_norms else None
        self.window = arch.window(i)
        self.rope = 1 if self.window and arch.rope_local_theta else 0   # index of its rope table


class LlamaModel:
    """Weights plus a pure forward function; holds no per-request state."""

    def __init__(self, arch: ModelArch, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str = "cpu", attention_backend: str = "auto",
                 linear_backend: str = "auto", quantized: dict[str, QuantWeight] | None = None,
                 quant_activations: str = "float") -> None:
        """`quantized`: projection weights kept packed (`Checkpoint.quantized`), run by `QuantLinear`
        with `quant_activations` (float | int8) in place of their float copies in `tensors`."""
        self.arch = arch
        quantized = quantized or {}
        self.dtype = dtype
        self.device = torch.device(device)
        dev = self.device
        self.embed = tensors["model.embed_tokens.weight"].to(device=dev, dtype=dtype).contiguous()
        head = tensors.get("lm_head.weight")
        if arch.tie_word_embeddings or head is None:
            head = self.embed  # a packed backend keeps its own copy; the lookup keeps this one
        self.lm_head: Proj
        if "lm_head.weight" in quantized:
            self.lm_head = QuantLinear(quantized["lm_head.weight"], None, quant_activations)
        else:
            self.lm_head = Linear(head.to(device=dev, dtype=dtype).contiguous(), None, linear_backend)
        self.final_norm = tensors["model.norm.weight"].to(device=dev, dtype=dtype)
        self.layers = [_Layer(tensors, i, arch, dtype, dev, linear_backend, quantized, quant_activations)
                       for i in range(arch.num_layers)]
        lin = next((x for x in (self.layers[0].qkv, self.lm_head) if isinstance(x, Linear)), None)
        self.linear_backend = lin.backend if lin is not None else "quantized"
        self.quantization = sorted({x.weight.fmt for x in self._projections() if isinstance(x, QuantLinear)})
        self.scale = arch.softmax_scale
        self.kernel = None
        if attention_backend in ("auto", "cpp") and self.device.type == "cpu":
            from pacer.model import kernels

            self.kernel = kernels.load()
            if self.kernel is None and attention_backend == "cpp":
                raise RuntimeError("attention_backend='cpp' but the C++ kernel could not be built")
        self.attention_backend = "cpp" if self.kernel is not None else "torch"
        # Whether the C++ kernels attend (decode rows, prefill chunks): `build_metadata`'s layout.
        # Prefill chunks go to the kernel where it has a vectorised tile (head_dim 64 / 128); at
        # other widths its scalar loop loses to SDPA (Gemma's 256: prefill 12-28% slower), so
        # there the chunks take the torch path and only the decode rows the kernel.
        on_kernel = self.kernel is not None
        self.rows_on_kernel = (on_kernel, on_kernel and arch.head_dim in _TILED_HEAD_DIMS)
        self._inv_freqs = [rope_inv_freq(arch).to(dev)]
        if arch.rope_local_theta and arch.sliding_layers:
            self._inv_freqs.append(rope_inv_freq(arch, local=True).to(dev))
        # each layer's RoPE inverse frequencies (a sliding layer may have its own base)
        self.layer_inv_freqs = [self._inv_freqs[layer.rope] for layer in self.layers]
        self._rope_cache_len = 0
        self._tables: list[tuple[torch.Tensor, torch.Tensor]] = []   # (cos, sin) per rope table, torch path
        self._tables_f: list[tuple[torch.Tensor, torch.Tensor]] = []   # the same in float32, C++ path
        self._ensure_rope(min(arch.max_position_embeddings, 4096))

    @property
    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies [head_dim / 2] (float32, on the model's device; scaling applied)
        of the full-attention layers."""
        return self._inv_freqs[0]

    def _projections(self) -> list[Proj]:
        return [self.lm_head] + [x for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]

    @property
    def weight_bytes(self) -> int:
        """Bytes of projection weights one decode step reads (packed blocks or float)."""
        return sum(x.weight.nbytes if isinstance(x, QuantLinear) else x.out_features * x.in_features
                   * self.dtype.itemsize for x in self._projections())

    def weights_line(self) -> str:
        """'projections Q4_1,Q8_0 (avx512vnni/float): 101.2 MB read per decode step'."""
        quant = [x for x in self._projections() if isinstance(x, QuantLinear)]
        dense = f"{str(self.dtype).removeprefix('torch.')} ({self.linear_backend})"
        kind = f"{','.join(self.quantization)} ({quant[0].path})" if quant else dense
        if quant and len(quant) < len(self._projections()):   # types without a packed kernel run float
            kind += f" + {dense}"
        isa = forced_isa()   # a fit made with every library held to AVX2 is not this CPU's native one
        return (f"projections {kind}: {self.weight_bytes / 1e6:.1f} MB read per decode step"
                + (f" (libraries forced to {isa})" if isa else ""))

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token in the model's dtype (kv_cache_dtype='auto')."""
        return self.kv_format("auto").bytes_per_token(self.arch.num_layers, self.arch.num_kv_heads,
                                                      self.arch.head_dim)

    def kv_format(self, kv_cache_dtype: str) -> KVFormat:
        return kv_format(kv_cache_dtype, self.dtype)

    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_cache_len:
            return
        n = max(n, 2 * self._rope_cache_len)
        t = torch.arange(n, device=self.device, dtype=torch.float32)
        self._tables, self._tables_f = [], []
        for inv in self._inv_freqs:
            freqs = torch.outer(t, inv)
            cos_f, sin_f = freqs.cos().contiguous(), freqs.sin().contiguous()
            self._tables_f.append((cos_f, sin_f))
            self._tables.append((cos_f.to(self.dtype), sin_f.to(self.dtype)))   # torch path, as HF
        self._rope_cache_len = n

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # rotate_half convention (HF / neox); x [T, heads, d], cos/sin [T, 1, d/2]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv_rope_write(self, qkv: torch.Tensor, layer: _Layer, positions: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, slot_mapping: torch.Tensor, fmt: KVFormat,
                        kv_scales: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, nh + 2 nkv, d] -> rotated q, k and v; k and v are stored in the cache
        (quantised on write when `fmt` is)."""
        a = self.arch
        nh, nkv, d, eps = a.num_heads, a.num_kv_heads, a.head_dim, a.rms_norm_eps
        q, k, v = qkv.split([nh, nkv, nkv], dim=1)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = F.rms_norm(q, (d,), layer.q_norm, eps)
            k = F.rms_norm(k, (d,), layer.k_norm, eps)
            if self.kernel is not None:
                qkv[:, :nh] = q
                qkv[:, nh:nh + nkv] = k
        if self.kernel is not None:
            self.kernel.rope_write_kv(qkv, positions, *self._tables_f[layer.rope], k_cache, v_cache, slot_mapping, nh,
                                      *kv_scales)
            return qkv.split([nh, nkv, nkv], dim=1)
        cos_t, sin_t = self._tables[layer.rope]
        cos, sin = cos_t[positions].unsqueeze(1), sin_t[positions].unsqueeze(1)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        write_kv(k_cache, v_cache, k, v, slot_mapping, fmt, kv_scales)
        return q, k, v

    def _add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """x += delta (in place, the residual stream), then rms_norm(x) * weight."""
        if self.kernel is not None:
            return self.kernel.add_rms_norm_(x, delta, weight, self.arch.rms_norm_eps)
        if delta is not None:
            x.add_(delta)
        return F.rms_norm(x, (x.shape[-1],), weight, self.arch.rms_norm_eps)

    def _act_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of the gated MLP."""
        if self.kernel is not None and self.arch.activation == "silu":
            return self.kernel.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        if self.arch.activation == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        return F.silu(gate) * up

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.arch.rms_norm_eps)

    def allocate_kv_cache(self, num_blocks: int, block_size: int,
                          fmt: KVFormat | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        a = self.arch
        fmt = fmt or self.kv_format("auto")
        shape = (num_blocks, block_size, a.num_kv_heads, fmt.head_width(a.head_dim))
        return [(torch.zeros(shape, dtype=fmt.storage, device=self.device),
                 torch.zeros(shape, dtype=fmt.storage, device=self.device)) for _ in range(a.num_layers)]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], logits_rows: torch.Tensor,
                kv_format: KVFormat | None = None) -> torch.Tensor:
        """input_ids, positions [T]; returns float32 logits [len(logits_rows), vocab].

        `kv_format`: how `kv_caches` are stored (default: the model's dtype)."""
        a = self.arch
        fmt = kv_format or self.kv_format("auto")
        nh, nkv, d = a.num_heads, a.num_kv_heads, a.head_dim
        T = input_ids.shape[0]
        self._ensure_rope(int(positions.max()) + 1)
        x = F.embedding(input_ids, self.embed)   # the residual stream, updated in place
        if a.scale_embeddings:
            x = x * torch.tensor(a.hidden_size ** 0.5, dtype=x.dtype)   # rounded to the dtype first, as HF
        h = self._add_norm(x, None, self.layers[0].in_norm)
        last = len(self.layers) - 1
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            qkv = layer.qkv(h).view(T, nh + 2 * nkv, d)
            kv_scales = fmt.scales(i)
            q, k, v = self._qkv_rope_write(qkv, layer, positions, k_cache, v_cache, meta.slot_mapping, fmt, kv_scales)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, self.kernel, fmt,
                                   kv_scales, layer.window).view(-1, nh * d)
            if i == last:
                # Past the last KV write only the rows that need logits matter: skip the
                # output projection and MLP of every other prefill token.
                x, attn = x[logits_rows], attn[logits_rows]
            attn = layer.o(attn)
            if layer.pre_ffn_norm is not None:   # sandwich norms: post_norm closes attention's branch
                h = self._add_norm(x, self._norm(attn, layer.post_norm), layer.pre_ffn_norm)
            else:
                h = self._add_norm(x, attn, layer.post_norm)
            mlp = layer.down(self._act_mul(layer.gate_up(h)))
            if layer.post_ffn_norm is not None:
                mlp = self._norm(mlp, layer.post_ffn_norm)
            h = self._add_norm(x, mlp, self.layers[i + 1].in_norm if i < last else self.final_norm)
        return self.lm_head(h).float()
