"""The report's production-scale and Airflow sections, and its pictures (docs/images/*.png).

Used by `run_all.py`: `scale_sections` renders `bench_scale.py` (local and S3 runs),
`bench_throughput.py` at the large size and `bench_airflow.py`; `draw` writes the PNGs
with matplotlib (Agg backend, no display).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMAGES = "images"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def scale_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for name in ("scale_local", "scale_s3"):
        r = results.get(name)
        if isinstance(r, dict) and "results" in r:
            runs += r["results"]
    return runs


def summary_rows(results: dict[str, Any], verdict: Any) -> list[list[str]]:
    """Headline rows at the largest size of each store."""
    rows = []
    runs = scale_runs(results)
    for store in ("local", "s3"):
        mine = [r for r in runs if r["store"] == store]
        if not mine:
            continue
        r = max(mine, key=lambda x: x["keys"])
        where = f"{r['keys']:,} keys, {_mb(r['full_state_bytes'])} state, {store}"
        rows.append([f"Bytes copied per checkpoint ÷ changed state bytes ({where})",
                     f"{r['bytes_ratio']:.2f}", "≤ 1.2", verdict(r["bytes_ratio"] <= 1.2),
                     (f"median {r['median_bytes_copied']:,.0f} B copied; changed state "
                      f"{r['changed_state_bytes']:,.0f} B "
                      f"({r['change']:.0%} of the keys); ÷ Spark's own new state files "
                      f"{r['spark_new_ratio']:.2f}")])
        s = r["restore_s"]
        rows.append([f"Restore ÷ (cold start + read savepoint once) ({where})", f"{r['restore_ratio']:.2f}",
                     "≤ 1.2", verdict(r["restore_ratio"] <= 1.2),
                     (f"restore {s['restore']:.1f} s, cold {s['cold']:.1f} s, read "
                      f"once {s['read_once']:.2f} s "
                      f"({_mb(r['savepoint_bytes'])}); materialize {s['materialize']:.2f} s; "
                      "plain Spark restart from "
                      f"its own checkpoint {s['spark_restart']:.1f} s (restore ÷ (that + read once) = "
                      f"{r['restore_vs_spark_restart']:.2f}){_load_text(r)}")])
        rows.append([f"Checkpoint duration, last ÷ first third of the run ({where})", f"{r['flatness']:.2f}",
                     "flat (≤ 1.5)", verdict(r["flatness"] <= 1.5),
                     (f"median {r['median_checkpoint_s']:.2f} s per checkpoint; "
                      f"{len(r['checkpoints'])} checkpoints, "
                      "all retained")])
    t = results.get("throughput_large", {})
    if "ratio" in t:
        rows.append([f"Throughput, Sparkpoint ÷ plain Spark ({t['keys']:,} keys)", f"{t['ratio']:.2f}",
                     "≥ 0.95", verdict(t["ratio"] >= 0.95),
                     (f"Sparkpoint {t['median_s']['sparkpoint']:.1f} s, plain "
                      f"{t['median_s']['plain']:.1f} s; rounds "
                      + ", ".join(f"{x:.2f}" for x in t["round_ratios"]))])
    c = results.get("throughput_cluster", {})
    if "ratio" in c:
        rows.append([f"Throughput on a standalone cluster ({c['keys']:,} keys, 2 workers)",
                     f"{c['ratio']:.2f}", "≥ 0.95", verdict(c["ratio"] >= 0.95),
                     (f"Sparkpoint {c['median_s']['sparkpoint']:.1f} s, plain "
                      f"{c['median_s']['plain']:.1f} s; rounds "
                      + ", ".join(f"{x:.2f}" for x in c["round_ratios"])
                      + f". Staged by the executors (their own JVMs): {c['median_s']['executors']:.1f} s = "
                      f"{c['executors_ratio']:.2f}")])
    a = results.get("airflow", {})
    if a.get("operator"):
        o = a["operator"]
        rows.append(["SparkpointSubmitOperator ÷ SparkSubmitOperator, dag.test()", f"{o['ratio']:.3f}",
                     "≤ 1.05", verdict(o["ratio"] <= 1.05),
                     (f"{o['median_s']['sparkpoint']:.1f} s vs {o['median_s']['plain']:.1f} s; rounds "
                      + ", ".join(f"{x:.3f}" for x in o["round_ratios"]))])
    sch = results.get("airflow_scheduler", {})
    if "ratio" in sch:
        rows.append(["SparkpointSubmitOperator ÷ SparkSubmitOperator, real scheduler (LocalExecutor)",
                     f"{sch['ratio']:.3f}", "≤ 1.05", verdict(sch["ratio"] <= 1.05),
                     (f"task {sch['median_s']['sparkpoint']:.1f} s vs "
                      f"{sch['median_s']['plain']:.1f} s (DAG run "
                      f"{sch['median_run_s']['sparkpoint']:.1f} s vs "
                      f"{sch['median_run_s']['plain']:.1f} s); rounds "
                      + ", ".join(f"{x:.3f}" for x in sch["round_ratios"]))])
    for s in a.get("sensors", []):
        rows.append([f"Requests per minute per waiting sensor ({s['sensors']} waiting, {s['backend']})",
                     f"{s['requests_per_min_per_sensor']:.1f}", "measured", verdict(None),
                     (f"{s['requests_per_poll']:.1f} requests per poll, one poll every "
                      f"{s['poll_interval_s']:g} s; "
                      f"{s['retained_checkpoints']} retained checkpoints; event loop lag max "
                      f"{s['max_loop_lag_s'] * 1000:.0f} ms ({s.get('steady_loop_lag_s', 0) * 1000:.0f} ms "
                      "once all had started)")])
    return rows


def _load_text(r: dict[str, Any]) -> str:
    """Spark's own state load after the restore and after the plain restart (its logs)."""
    s, loads = r["restore_s"], r.get("state_load", {})
    if "restore_load" not in s:
        return ""
    def one(name: str) -> str:
        info = loads.get(name, {})
        # Spark logs a replay only when there is one: no replay line means it loaded a snapshot.
        if info.get("snapshot") is None and info.get("replayed") == 0:
            start = "a RocksDB snapshot, nothing replayed"
        else:
            start = ("snapshot v{}".format(info["snapshot"]) if info.get("snapshot") else "no snapshot") + \
                f", {info.get('replayed', '?')} changelogs replayed"
        return f"{s.get(name + '_load', 0):.1f} s (median; last round: {start})"
    same = ""
    if "spark_same" in s:
        same = ("; plain Spark restart from the savepoint's own files "
                f"{s['spark_same']:.1f} s (restore ÷ that = "
                f"{r['restore_vs_spark_same']:.2f}), state load {one('spark_same')}")
    return f"; Spark's state load: restore {one('restore')}, plain restart {one('spark_restart')}{same}"


def scale_sections(results: dict[str, Any]) -> list[str]:
    runs = scale_runs(results)
    out: list[str] = []
    if runs:
        out += ["## Production scale", "",
                ("`bench_scale.py` (`make bench-large`): a running total and count per key "
                "(numeric keys, RocksDB with"),
                ("changelog checkpointing, `local[2]`, 2 shuffle partitions), built by "
                "loading every key once, then"),
                ("update batches that each change 5 % of the keys; a retained checkpoint "
                "after every batch, every"),
                ("checkpoint retained; then a savepoint and alternating restore / cold "
                "start / plain Spark restart."),
                "State bytes = Spark's changelog of the first build (the state in Spark's own format).", ""]
        out += _table(["store", "keys", "state", "median copied / checkpoint", "÷ changed state",
                       "÷ Spark's new files", "checkpoint s (median)", "flatness", "savepoint s", "restore s",
                       "cold s", "Spark restart s", "read once s", "restore ÷ (cold + read)"],
                      [[r["store"], f"{r['keys']:,}", _mb(r["full_state_bytes"]),
                        f"{r['median_bytes_copied']:,.0f}",
                        f"{r['bytes_ratio']:.2f}", f"{r['spark_new_ratio']:.2f}",
                        f"{r['median_checkpoint_s']:.2f}",
                        f"{r['flatness']:.2f}", f"{r['savepoint_s']:.2f}", f"{r['restore_s']['restore']:.1f}",
                        f"{r['restore_s']['cold']:.1f}", f"{r['restore_s']['spark_restart']:.1f}",
                        f"{r['restore_s']['read_once']:.2f}", f"{r['restore_ratio']:.2f}"] for r in runs])
        out += ["", (f"![checkpoint bytes vs state size]({IMAGES}/checkpoint-bytes.png) "
                f"![restore time vs state size]({IMAGES}/restore-time.png)"), ""]
        out += ["### Where the time goes (largest size)", "",
                ("Per checkpoint, wall time of the coordinator's phases (medians over the "
                "update checkpoints; hash and"),
                "upload run on 8 threads, so they are summed thread time), and S3 requests per checkpoint:",
                ""]
        rows = []
        for r in runs:
            if r["keys"] != max(x["keys"] for x in runs if x["store"] == r["store"]):
                continue
            upd = r["checkpoints"][r["load_batches"]:]
            def med(key: str, upd: list[dict[str, Any]] = upd) -> float:
                values = sorted(c["phases"].get(key, 0.0) for c in upd)
                return values[len(values) // 2] if values else 0.0
            s3 = sum(v for c in upd for k, v in c["phases"].items() if k.startswith("s3:")) / max(1, len(upd))
            rows.append([r["store"], f"{r['keys']:,}", f"{med('total'):.3f}", f"{med('hash'):.3f}",
                         f"{med('upload'):.3f}", f"{med('list_shared'):.3f}", f"{med('metadata'):.3f}",
                         f"{med('retention'):.3f}", f"{s3:.1f}" if r["store"] == "s3" else "-",
                         f"{r['restore_s']['materialize']:.2f}",
                         (f"{r['restore_s'].get('restore_spark', 0):.1f} / "
                         f"{r['restore_s'].get('spark_restart_spark', 0):.1f}"),
                         (f"{r['restore_s']['restore_load']:.1f} / "
                          f"{r['restore_s'].get('spark_restart_load', 0):.1f}"
                          if "restore_load" in r["restore_s"] else "-")])
        out += _table(["store", "keys", "checkpoint s", "hash s", "upload s", "list shared/ s", "metadata s",
                       "retention s", "S3 requests", "restore: materialize s",
                       "Spark's batch after restore / after plain restart s",
                       "of which Spark's state load (its log) s"], rows)
        out += ["", f"![checkpoint duration over a run]({IMAGES}/checkpoint-duration.png)", ""]
    x = results.get("transfers", {})
    if x.get("results"):
        out += ["### Parallel transfers", "",
                (f"`bench_transfers.py`: the {x['files']} files ({_mb(x['bytes'])}) of the "
                "2,000,000-key state, checkpointed"),
                ("(every file new), saved as a savepoint and materialized, with "
                 f"{x['threads']} transfers at a time "
                 f"and with one at a time, in {x['rounds']} paired alternating rounds"),
                "(ratio = median of the rounds' one-at-a-time ÷ parallel time):", ""]
        out += _table(["store", "step", "one at a time s", f"{x['threads']} at a time s", "ratio"],
                      [[r["store"], step, f"{r['median_s']['sequential'][step]:.2f}",
                        f"{r['median_s']['parallel'][step]:.2f}", f"{ratio:.2f}"]
                       for r in x["results"] for step, ratio in r["ratios"].items()])
        out += [""]
    t = results.get("throughput_large", {})
    a = results.get("airflow", {})
    if "ratio" in t or a:
        out += [f"![throughput ratio per round]({IMAGES}/throughput-rounds.png)", ""] if "ratio" in t else []
    if a.get("sensors"):
        out += ["## The Airflow path", ""]
        if a.get("operator"):
            o = a["operator"]
            out += [(f"`bench_airflow.py`: the quickstart application ({o['files']} batches of "
                    f"{o['users']:,} events) as a"),
                    ("one-task DAG under `dag.test()`, submitted by "
                    "`SparkpointSubmitOperator` and by the Spark"),
                    ("provider's `SparkSubmitOperator` with the same `spark.sparkpoint.*` "
                    "conf (real spark-submit)."), ""]
            out += _table(["round", "SparkpointSubmitOperator s", "SparkSubmitOperator s", "ratio"],
                          [[str(i), f"{s:.1f}", f"{p:.1f}", f"{s / p:.3f}"] for i, (s, p) in
                           enumerate(zip(o["all_s"]["sparkpoint"], o["all_s"]["plain"], strict=True))])
            out += [""]
        out += [("Waiting sensors (`SparkpointCheckpointTrigger.run` driven in one "
                "asyncio loop, as the triggerer"),
                "does, each waiting for a checkpoint that never comes):", ""]
        out += _table(["store", "sensors", "retained checkpoints", "poll every", "requests / min / sensor",
                       "requests / poll", "loop lag max (steady)"],
                      [[s["backend"], str(s["sensors"]), str(s["retained_checkpoints"]),
                        f"{s['poll_interval_s']:g} s",
                        f"{s['requests_per_min_per_sensor']:.1f}", f"{s['requests_per_poll']:.1f}",
                        (f"{s['max_loop_lag_s'] * 1000:.0f} ms ({s.get('steady_loop_lag_s', 0) * 1000:.0f} "
                        "ms)")]
                       for s in a["sensors"]])
        out += [""]
    return out


def draw(results: dict[str, Any], docs: Path) -> list[str]:
    """Write the PNGs the report links to; return their names (skipped when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = docs / IMAGES
    out.mkdir(parents=True, exist_ok=True)
    written = []
    runs = scale_runs(results)
    colors = {"local": "tab:blue", "s3": "tab:orange"}
    if runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        for store in ("local", "s3"):
            mine = sorted((r for r in runs if r["store"] == store), key=lambda r: r["full_state_bytes"])
            if mine:
                xs = [r["full_state_bytes"] / 1e6 for r in mine]
                ax.plot(xs, [r["median_bytes_copied"] / 1e6 for r in mine], "o-", color=colors[store],
                        label=f"copied per checkpoint ({store})")
        ref = sorted(runs, key=lambda r: r["full_state_bytes"])
        ax.plot([r["full_state_bytes"] / 1e6 for r in ref], [r["changed_state_bytes"] / 1e6 for r in ref],
                "k--", label="changed state (5 % of keys)")
        ax.set(xscale="log", yscale="log", xlabel="state (MB)", ylabel="MB",
               title="Checkpoint bytes vs state size")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "checkpoint-bytes.png", dpi=100)
        plt.close(fig)
        written.append("checkpoint-bytes.png")

        fig, ax = plt.subplots(figsize=(6, 4))
        for store in ("local", "s3"):
            mine = sorted((r for r in runs if r["store"] == store), key=lambda r: r["full_state_bytes"])
            if not mine:
                continue
            xs = [r["full_state_bytes"] / 1e6 for r in mine]
            ax.plot(xs, [r["restore_s"]["restore"] for r in mine], "o-", color=colors[store],
                    label=f"restore ({store})")
            ax.plot(xs, [r["restore_s"]["cold"] + r["restore_s"]["read_once"] for r in mine], "s:",
                    color=colors[store], label=f"cold + read once ({store})")
            ax.plot(xs, [r["restore_s"]["spark_restart"] for r in mine], "^--", color=colors[store],
                    alpha=0.6, label=f"plain Spark restart ({store})")
        ax.set(xscale="log", xlabel="state (MB)", ylabel="seconds", title="Restore time vs state size")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "restore-time.png", dpi=100)
        plt.close(fig)
        written.append("restore-time.png")

        fig, ax = plt.subplots(figsize=(6, 4))
        for store in ("local", "s3"):
            mine = [r for r in runs if r["store"] == store]
            if mine:
                r = max(mine, key=lambda x: x["keys"])
                ys = [c["duration_s"] for c in r["checkpoints"]]
                ax.plot(range(1, len(ys) + 1), ys, "o-", color=colors[store],
                        label=f"{store}, {r['keys']:,} keys")
        ax.set(xlabel="checkpoint (= checkpoints retained)", ylabel="seconds", yscale="log",
               title="Checkpoint duration over a run")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "checkpoint-duration.png", dpi=100)
        plt.close(fig)
        written.append("checkpoint-duration.png")
    series = [(name, results[name]) for name in ("throughput", "throughput_large", "throughput_cluster")
              if isinstance(results.get(name), dict) and "round_ratios" in results[name]]
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, t in series:
            ax.plot(range(1, len(t["round_ratios"]) + 1), t["round_ratios"], "o-",
                    label=f"{t['keys']:,} keys{', cluster' if name == 'throughput_cluster' else ''} "
                          f"(median {t['ratio']:.2f})")
        ax.axhline(0.95, color="k", linestyle="--", label="target 0.95")
        ax.set(xlabel="round", ylabel="plain ÷ Sparkpoint time", title="Throughput ratio per round")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "throughput-rounds.png", dpi=100)
        plt.close(fig)
        written.append("throughput-rounds.png")
    return written
