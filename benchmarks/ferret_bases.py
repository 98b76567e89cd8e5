"""Benchmark: the cost of Ferret's bases per pass, and the noise of shared vs per-client bases.

1. Pass cost, on the block layout of SmolLM2-135M (built on the meta device: shapes only, so no
   checkpoint is needed; ``--quick`` keeps 2 of its 30 layers and an 8K vocabulary). One
   client's projection (Eq. 8: gamma = V^T Delta / (rho K) for every block, K_l by the paper's
   allocation for an update whose block norms grow like sqrt(d_l)), timed for:
     * ``per_slot_truncated_normal``: the previous implementation (and the official code's way):
       each slot's whole d_l-vector drawn by inverse-CDF truncated normal, then one dot product;
     * ``chunked_truncated_normal`` / ``chunked_uniform``: algorithms/shared_bases.py, K_l slots
       drawn 64K elements at a time into one buffer, one matrix-vector product per chunk;
   then the server's reconstruction (``chunked_uniform``) and a cached catch-up (one add).
   After one untimed warm-up, repetitions are interleaved; the table gives the median and range.
2. Noise of the aggregate (1/N) sum_i Delta~_i against mean_i Delta_i, relative squared error, for
   shared bases and per-client seeds (algorithms/ferret.py), N clients with identical,
   orthogonal or partly shared updates; mean over draws with a 95% t-interval beside the formula.

    python benchmarks/ferret_bases.py          # full layout; writes benchmarks/results/ferret_bases.json
    python benchmarks/ferret_bases.py --quick  # smoke; writes benchmarks/results/ferret_bases_smoke.json
Both write the generated part of the Ferret bases section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from protocol import markdown_table, replace_section
from scipy import stats

from taciturn.algorithms.replay import RoundCache
from taciturn.algorithms.shared_bases import (
    Bases,
    Contribution,
    allocate_bases,
    apply_pieces,
    basis_variance,
    block_vector,
    group_blocks,
)
from taciturn.core.rng import SERVER, Streams

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "flock /tmp/taciturn-cpu.lock env PYTHONPATH=src python benchmarks/ferret_bases.py"


def smollm2_shapes(layers: int, vocab: int) -> dict[str, torch.Size]:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return {name: p.shape for name, p in model.named_parameters()}


def per_slot_truncated_normal(streams, delta, blocks, counts, round):
    """The previous projection: one whole basis per slot (inverse-CDF truncated normal), one dot."""
    coords = []
    for l, (block, k_l) in enumerate(zip(blocks, counts, strict=True)):
        d_l = block_vector(delta, block)
        bound = 1.0 / math.sqrt(block.size)
        edge = math.erf(bound / math.sqrt(2.0))
        gamma = []
        for k in range(k_l):
            g = streams.torch(round, SERVER, f"ferret-basis/{l}/{k}")
            v = torch.empty(block.size).uniform_(-edge, edge, generator=g).erfinv_().mul_(math.sqrt(2.0))
            gamma.append(v.clamp_(-bound, bound) @ d_l)
        coords.append(torch.stack(gamma) / (basis_variance("truncated_normal", block.size) * k_l))
    return torch.cat(coords)


def pass_costs(layers: int, vocab: int, K: int, repeats: int) -> dict:
    shapes = smollm2_shapes(layers, vocab)
    g = torch.Generator().manual_seed(0)
    delta = {name: torch.randn(shape, generator=g) * 1e-3 for name, shape in shapes.items()}
    blocks = group_blocks(delta)
    counts = allocate_bases([float(block_vector(delta, b).norm()) for b in blocks], K)
    elements = sum(b.size * k for b, k in zip(blocks, counts, strict=True))
    streams = Streams(0)
    uniform, truncated = Bases(streams, "uniform"), Bases(streams, "truncated_normal")
    coords = uniform.project(delta, blocks, counts, 1, SERVER)
    cache = RoundCache(2**40)
    cache.put(1, uniform.reconstruct(blocks, [Contribution(SERVER, counts, coords)], 1))
    params = {name: torch.zeros(shape) for name, shape in shapes.items()}
    work = {
        "per_slot_truncated_normal": lambda: per_slot_truncated_normal(streams, delta, blocks, counts, 1),
        "chunked_truncated_normal": lambda: truncated.project(delta, blocks, counts, 1, SERVER),
        "chunked_uniform": lambda: uniform.project(delta, blocks, counts, 1, SERVER),
        "reconstruction (chunked_uniform)": lambda: uniform.reconstruct(
            blocks, [Contribution(SERVER, counts, coords)], 1
        ),
        "catch-up from the cache": lambda: apply_pieces(params, blocks, cache.get(1), -1.0),
    }
    for fn in work.values():  # warm-up, untimed: first-touch allocations, rho_l per block size
        fn()
    seconds = {name: [] for name in work}
    for _ in range(repeats):  # interleaved, so that a change in the machine's load hits every method
        for name, fn in work.items():
            started = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - started)
    return {
        "layers": layers,
        "vocab": vocab,
        "params": sum(b.size for b in blocks),
        "blocks": len(blocks),
        "max_bases_per_block": K,
        "basis_elements_per_pass": elements,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
    }


def noise(d: int, K: int, clients: tuple[int, ...], draws: int) -> list[dict]:
    """Relative squared error of the aggregate, shared vs per-client bases, against the formulas."""
    blocks = group_blocks({"w": torch.zeros(d)})
    bases = Bases(Streams(1), "uniform")
    factor = (9 / 5 + d - 2) / K  # e(D) / ||D||^2 for uniform bases (shared_bases.py)
    rows = []
    g = torch.Generator().manual_seed(2)
    for N in clients:
        common = torch.randn(d, generator=g)
        cases = {
            "identical": common.expand(N, d).clone(),
            "orthogonal": torch.eye(d)[:N] * math.sqrt(d),
            "half shared": common + torch.randn(N, d, generator=g),
        }
        for case, updates in cases.items():
            mean = updates.mean(0)
            for seeds in ("shared", "per_client"):
                errors = []
                for r in range(draws):
                    owners = [SERVER] * N if seeds == "shared" else list(range(N))
                    gammas = [
                        bases.project({"w": u}, blocks, [K], r, o) / N
                        for u, o in zip(updates, owners, strict=True)
                    ]
                    contributions = (
                        [Contribution(SERVER, [K], sum(gammas))]
                        if seeds == "shared"
                        else [Contribution(o, [K], gm) for o, gm in zip(owners, gammas, strict=True)]
                    )
                    (piece,) = bases.reconstruct(blocks, contributions, r)
                    errors.append(float((piece - mean).pow(2).sum() / mean.pow(2).sum()))
                theory = (
                    factor
                    if seeds == "shared"
                    else factor * float(updates.pow(2).sum()) / N**2 / float(mean.pow(2).sum())
                )
                half = stats.t.ppf(0.975, draws - 1) * np.std(errors, ddof=1) / math.sqrt(draws)
                rows.append(
                    {
                        "clients": N,
                        "updates": case,
                        "bases": seeds,
                        "rel_sq_error": float(np.mean(errors)),
                        "ci": [float(np.mean(errors) - half), float(np.mean(errors) + half)],
                        "formula": theory,
                    }
                )
    return rows


def write_docs(results: dict, name: str) -> None:
    p = results["pass"]
    base = np.median(p["seconds"]["per_slot_truncated_normal"])
    rows = [
        [
            method,
            f"{np.median(s):.3f}",
            f"{min(s):.3f} - {max(s):.3f}",
            f"{p['basis_elements_per_pass'] / np.median(s) / 1e6:,.0f}" if "catch-up" not in method else "",
            f"{base / np.median(s):.2f}",
        ]
        for method, s in p["seconds"].items()
    ]
    noise_rows = [
        [
            r["clients"],
            r["updates"],
            r["bases"],
            f"{r['rel_sq_error']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]",
            f"{r['formula']:.2f}",
        ]
        for r in results["noise"]
    ]
    flag = " --quick" if results["scale"] == "smoke" else ""
    body = f"""Generated by `{COMMAND}{flag}` (scale: **{results["scale"]}**; numbers in
`benchmarks/results/{name}`).

One client's projection on the block layout of SmolLM2-135M with {p["layers"]} layer(s) and a
{p["vocab"]:,}-token vocabulary ({p["params"]:,} parameters, {p["blocks"]} blocks,
K = {p["max_bases_per_block"]}:
{p["basis_elements_per_pass"]:,} basis elements a pass), {len(p["seconds"]["chunked_uniform"])} interleaved
repetitions on {p["threads"]} threads:

{markdown_table(["pass", "median s", "range s", "M elements / s", "speed-up vs per-slot"], rows)}

Noise of the aggregate: relative squared error ||(1/N) sum_i D~_i - mean_i D_i||^2 / ||mean_i D_i||^2,
d = {results["noise_setting"]["d"]}, K = {results["noise_setting"]["K"]}, uniform bases, mean of
{results["noise_setting"]["draws"]} draws with its 95% t-interval, beside the formula of
`algorithms/ferret.py`:

{markdown_table(["N", "client updates", "bases", "measured", "formula"], noise_rows)}"""
    replace_section("ferret-bases", body, "Ferret's bases: cost per pass and noise")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke: 2 layers, an 8K vocabulary, fewer draws")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.quick:
        results = {"scale": "smoke", "pass": pass_costs(layers=2, vocab=8192, K=16, repeats=5)}
        setting = {"d": 1024, "K": 16, "clients": (2, 8), "draws": 30}
    else:
        results = {"scale": "full", "pass": pass_costs(layers=30, vocab=49152, K=16, repeats=5)}
        setting = {"d": 4096, "K": 16, "clients": (2, 8), "draws": 100}
    results["noise_setting"] = setting
    results["noise"] = noise(setting["d"], setting["K"], setting["clients"], setting["draws"])
    name = "ferret_bases_smoke.json" if args.quick else "ferret_bases.json"
    path = ROOT / "benchmarks" / "results" / name
    path.write_text(
        json.dumps({"command": COMMAND + (" --quick" if args.quick else ""), **results}, indent=1)
    )
    write_docs(results, name)
    for method, s in results["pass"]["seconds"].items():
        print(f"{method:36s} median {np.median(s):.3f} s")
    for r in results["noise"]:
        print(r)


if __name__ == "__main__":
    main()
