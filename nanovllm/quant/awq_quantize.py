"""Make AWQ checkpoints: `python -m nanovllm.quant.awq_quantize --model DIR --out DIR [--method awq|rtn]`.

Round-to-nearest (rtn): per output channel and group of `group_size` inputs,
    scale = (max - min) / 15,  zero = round(-min / scale),  q = clamp(round(w / scale) + zero, 0, 15).
AWQ (Lin et al., 2023): a few input channels carry large activations, and their weights matter most. For
each group of linears that read the same input (q/k/v after input_layernorm, gate/up after
post_attention_layernorm, down after up, o after v when their shapes match) it searches a per-input-channel
scale s = mean|x|^alpha over a grid of alpha, quantizes W * s, and keeps the alpha whose output
x (Q(W s) / s)^T is closest to x W^T on calibration activations; 1 / s is folded into the layer that
produces x (the norm's weight, or the previous linear's output rows), so the model computes the same
function with easier-to-quantize weights. Then, per linear, it searches how much to clip each group's
range (shrinking max|w| by up to half) to minimise the output error.

Output: AutoAWQ's GEMM format (see awq.py) in safetensors, config.json with its quantization_config.
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file

from nanovllm.config import load_hf_config
from nanovllm.models.decoder import head_dim_of  # a tool (entry point): it may import from above quant
from nanovllm.quant.awq import pack_awq

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_rtn(w: torch.Tensor, group_size: int, clip: torch.Tensor | None = None):
    """w [out, in] -> (q [out, in] 0..15, zeros [out, in / group], scales [out, in / group]).
    clip [out, in / group] optionally narrows each group's range to [-clip, clip] before quantizing."""
    out_f, in_f = w.shape
    g = w.float().view(out_f, in_f // group_size, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    if clip is not None:
        lo, hi = torch.maximum(lo, -clip), torch.minimum(hi, clip)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    zeros = (-lo / scales).round().clamp(0, 15)
    q = (g / scales[..., None]).round() + zeros[..., None]
    return q.clamp(0, 15).view(out_f, in_f).to(torch.int32), zeros.to(torch.int32), scales


def fake_quantize(w: torch.Tensor, group_size: int, clip: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize then dequantize w [out, in] (float32)."""
    q, zeros, scales = quantize_rtn(w, group_size, clip)
    out_f, in_f = w.shape
    q = q.view(out_f, in_f // group_size, group_size).float()
    return ((q - zeros[..., None]) * scales[..., None]).view(out_f, in_f)


def to_awq_tensors(w: torch.Tensor, group_size: int, clip: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """w [out, in] -> AutoAWQ GEMM tensors (W is stored transposed: [in, out])."""
    q, zeros, scales = quantize_rtn(w, group_size, clip)
    return {"qweight": pack_awq(q.t().contiguous()), "qzeros": pack_awq(zeros.t().contiguous()),
            "scales": scales.t().contiguous().to(torch.float16)}


def search_scale(x: torch.Tensor, weights: list[torch.Tensor], group_size: int, grid: int = 20) -> torch.Tensor:
    """Per-input-channel scale s [in] minimising sum_W ||x W^T - x (Q(W s) / s)^T||^2 over alpha."""
    x = x.float()
    ref = [x @ w.float().t() for w in weights]
    act = x.abs().mean(0).clamp(min=1e-6)
    best, best_err = torch.ones_like(act), float("inf")
    for i in range(grid + 1):
        s = act ** (i / grid)
        s = s / (s.max() * s.min()).sqrt()
        err = sum(((x @ (fake_quantize(w.float() * s, group_size) / s).t() - r) ** 2).sum().item()
                  for w, r in zip(weights, ref))
        if err < best_err:
            best, best_err = s, err
    return best


def search_clip(x: torch.Tensor, w: torch.Tensor, group_size: int, steps: int = 10) -> torch.Tensor:
    """Per (output channel, group) clipping threshold [out, in / group] minimising the output error."""
    out_f, in_f = w.shape
    w = w.float()
    full = w.view(out_f, in_f // group_size, group_size).abs().amax(-1)
    xg = x.float().view(-1, in_f // group_size, group_size)                      # [tokens, groups, group]
    wg = w.view(out_f, in_f // group_size, group_size)
    ref = torch.einsum("tgk,ogk->tog", xg, wg)
    best, best_err = full.clone(), torch.full_like(full, float("inf"))
    for i in range(steps):
        clip = full * (1 - 0.5 * i / steps)
        approx = fake_quantize(w, group_size, clip).view_as(wg)
        err = ((torch.einsum("tgk,ogk->tog", xg, approx) - ref) ** 2).sum(0)       # [out, groups]
        better = err < best_err
        best, best_err = torch.where(better, clip, best), torch.where(better, err, best_err)
    return best


def capture_inputs(model, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs [tokens, in] of every linear in the decoder layers, from one forward pass."""
    inputs, hooks = {}, []
    for name, module in model.named_modules():
        if name.split(".")[-1] in LINEARS:
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, name=name: inputs.__setitem__(name, args[0].detach().flatten(0, -2).float())))
    with torch.no_grad():
        model(input_ids)
    for h in hooks:
        h.remove()
    return inputs


@torch.no_grad()
def apply_awq_scales(model, inputs: dict[str, torch.Tensor], group_size: int) -> dict[str, torch.Tensor]:
    """Search and fold AWQ scales layer by layer; returns each linear's input as the scaled model sees it."""
    seen = dict(inputs)
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        groups = [(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], p + "self_attn.q_proj",
                   [p + f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]),
                  (layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], p + "mlp.gate_proj",
                   [p + "mlp.gate_proj", p + "mlp.up_proj"]),
                  (mlp.up_proj, [mlp.down_proj], p + "mlp.down_proj", [p + "mlp.down_proj"])]
        if attn.v_proj.weight.shape[0] == attn.o_proj.weight.shape[1]:     # v's outputs are o's inputs
            groups.append((attn.v_proj, [attn.o_proj], p + "self_attn.o_proj", [p + "self_attn.o_proj"]))
        for prev, linears, source, names in groups:
            s = search_scale(inputs[source], [lin.weight for lin in linears], group_size)
            for lin in linears:
                lin.weight.mul_(s.to(lin.weight.dtype))                    # columns: inputs scaled up
            if isinstance(prev, torch.nn.Linear):
                prev.weight.div_(s[:, None].to(prev.weight.dtype))         # rows: outputs scaled down
            else:
                prev.weight.div_(s.to(prev.weight.dtype))
            for name in names:
                seen[name] = inputs[name] / s
    return seen


def quantize_model(model, input_ids: torch.Tensor | None, group_size: int, method: str) -> dict[str, torch.Tensor]:
    """State dict in AutoAWQ's GEMM format (non-linear tensors in float16)."""
    if method == "awq":
        inputs = apply_awq_scales(model, capture_inputs(model, input_ids), group_size)
    tensors = {}
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in state:
        if torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
            del state["lm_head.weight"]       # tied: the embedding is the head, as in the input checkpoint
    for name, param in state.items():
        module_name, _, kind = name.rpartition(".")
        if module_name.split(".")[-1] in LINEARS and kind == "weight":
            clip = search_clip(inputs[module_name], param, group_size) if method == "awq" else None
            tensors.update({f"{module_name}.{k}": v for k, v in to_awq_tensors(param, group_size, clip).items()})
        else:
            tensors[name] = param.to(torch.float16).clone().contiguous()
    return tensors


def calibration_ids(tokenizer, path: str | None, max_tokens: int, vocab_size: int | None = None) -> torch.Tensor:
    """Token ids [1, n] of a text file, a JSON list of ids, or by default the Zen of Python. ValueError for
    input that cannot calibrate: a missing or unreadable file, JSON that is not a non-empty list of ids in
    [0, vocab_size), text with no tokens."""
    if path and not os.path.isfile(path):
        raise ValueError(f"--calib {path!r} is not a file; give a UTF-8 text file or a .json list of token ids")
    if path and path.endswith(".json"):
        try:
            with open(path) as f:
                ids = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"--calib {path!r} is not valid JSON ({e}); a .json file must hold a list of token "
                             f"ids") from None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"--calib {path!r} must hold a JSON list of integer token ids, e.g. [151643, 872]")
        if vocab_size is not None and any(not 0 <= i < vocab_size for i in ids):
            raise ValueError(f"--calib {path!r} has token ids outside [0, {vocab_size}) (the model's vocabulary)")
    else:
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError:
                raise ValueError(f"--calib {path!r} is not UTF-8 text; give a text file or a .json list of "
                                 f"token ids") from None
        else:
            from nanovllm.demo.train import zen_of_python
            text = zen_of_python() * 4
        ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"--calib {path!r} gives no tokens to calibrate on; it needs some text or ids")
    return torch.tensor([ids[:max_tokens]])


def quantize_checkpoint(model_dir: str, out_dir: str, method: str = "awq", group_size: int = 128,
                        calib: str | None = None, calib_tokens: int = 512) -> str:
    """Write an AWQ (GEMM format) copy of the checkpoint in model_dir to out_dir. The input is never
    touched: out_dir may not be model_dir or lie inside it, and the files are written to a temporary folder
    beside out_dir that takes its place only when complete."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    check_settings(model_dir, out_dir, group_size, calib_tokens)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = calibration_ids(AutoTokenizer.from_pretrained(model_dir), calib, calib_tokens, model.config.vocab_size)
    tensors = quantize_model(model, ids, group_size, method)
    final, out_dir = out_dir, tempfile.mkdtemp(prefix=".awq-", dir=os.path.dirname(os.path.abspath(out_dir)))
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config.pop("torch_dtype", None)
    config["dtype"] = "float16"
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                     "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(model_dir):
        if name.startswith(("tokenizer", "generation_config", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(os.path.join(model_dir, name), out_dir)
    if not os.path.isdir(final):
        os.replace(out_dir, final)
        return final
    for name in os.listdir(out_dir):     # an existing folder keeps its other files
        os.replace(os.path.join(out_dir, name), os.path.join(final, name))
    os.rmdir(out_dir)
    return final


def check_settings(model_dir: str, out_dir: str, group_size: int, calib_tokens: int) -> None:
    """ValueError, before anything is read or written, for settings that cannot work."""
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"--model {model_dir!r} is not a checkpoint directory (no config.json)")
    model, out = os.path.realpath(model_dir), os.path.realpath(out_dir)
    if out == model or out.startswith(model + os.sep) or model.startswith(out + os.sep):
        raise ValueError(f"--out {out_dir!r} must not be the model directory, inside it or around it: the "
                         f"source checkpoint would be overwritten")
    if group_size < 8 or group_size % 8:
        raise ValueError(f"--group-size must be a positive multiple of 8 (AWQ packs 8 values per word), got "
                         f"{group_size}")
    if calib_tokens < 1:
        raise ValueError(f"--calib-tokens must be >= 1, got {calib_tokens}")
    widths = linear_input_widths(load_hf_config(model_dir))
    if any(w % group_size for w in widths.values()):
        fits = [g for g in range(8, min(widths.values()) + 1, 8) if all(w % g == 0 for w in widths.values())]
        raise ValueError(f"--group-size {group_size} must divide every quantized layer's input size "
                         f"({', '.join(f'{k} {v}' for k, v in widths.items())}); "
                         + (f"this model takes {', '.join(map(str, fits[-3:]))}" if fits else
                            "no multiple of 8 divides them all"))


def linear_input_widths(cfg) -> dict[str, int]:
    """The input size of each kind of linear layer the quantizer writes, from the HF config."""
    widths = {"q/k/v/gate/up_proj": cfg.hidden_size, "o_proj": cfg.num_attention_heads * head_dim_of(cfg),
              "down_proj": cfg.intermediate_size}
    if getattr(cfg, "moe_intermediate_size", None):
        widths["experts' down_proj"] = cfg.moe_intermediate_size
    return widths


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--method", choices=["awq", "rtn"], default="awq")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--calib", default=None, help="a text file or a JSON list of token ids")
    parser.add_argument("--calib-tokens", type=int, default=512)
    args = parser.parse_args()
    try:
        quantize_checkpoint(args.model, args.out, args.method, args.group_size, args.calib, args.calib_tokens)
    except ValueError as e:
        parser.error(str(e))
    print(f"wrote {args.out} ({args.method}, group size {args.group_size})")


if __name__ == "__main__":
    main()
