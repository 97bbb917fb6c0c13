"""Plots of a run: whole-number steps on the x axis; a flat series is drawn flat, not as a climb."""

import json

import pytest

from rlt.run.plots import make_plots, y_limits


def test_y_limits_give_a_flat_series_room_and_leave_a_real_change_alone():
    assert y_limits([2.30001, 2.30002, 2.30003]) == pytest.approx((2.30002 - 0.1150015, 2.30002 + 0.1150015))
    assert y_limits([0.0, 0.0]) == pytest.approx((-0.05, 0.05))
    assert y_limits([1.0, 3.0]) is None
    assert y_limits([None, float("nan")]) is None


def test_plots_use_integer_steps_and_keep_a_flat_loss_flat(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    rows = [{"stage": "sft", "step": s, "loss": 2.3 + 1e-5 * s} for s in (1, 2, 3)]
    rows += [
        {
            "stage": "rl",
            "step": s,
            "reward": -1.0 + 0.5 * s,
            "reward_std": 0.1,
            "r_ss": -1.0,
            "r_kl": 0.0,
            "format_penalty": 0.0,
            "kl": 0.001 * s,
            "seconds_generate": 1.0,
            "seconds_score": 0.5,
        }
        for s in (1, 2, 3)
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    saved = {}
    real_savefig = Figure.savefig

    def keep(fig, path, *a, **kw):
        fig.canvas.draw()  # ticks exist once drawn
        saved[path.name] = fig
        return real_savefig(fig, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    written = make_plots(metrics, tmp_path / "plots")
    assert {p.name for p in written} == {"rl_reward.png", "rl_step_time.png", "sft_loss.png"}
    for fig in saved.values():
        for ax in fig.axes:
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    # stacked phase bars start at 0: limits fitted to the (flat) totals would hide the lower phases
    assert saved["rl_step_time.png"].axes[0].get_ylim()[0] == 0
    [loss_ax] = saved["sft_loss.png"].axes
    lo, hi = loss_ax.get_ylim()
    assert hi - lo >= 0.1  # a change of 2e-5 stays a flat line, not a rise over the whole panel
    assert loss_ax.yaxis.get_major_formatter().get_offset() == ""  # no '+2.3' offset label
    reward_ax = saved["rl_reward.png"].axes[0]
    assert reward_ax.get_ylim()[1] - reward_ax.get_ylim()[0] < 3  # a real change keeps matplotlib's limits
    # GRPO KL (0.001-0.003) on an axis of its own, not flattened against the format penalty's scale
    [penalty_ax] = [a for a in saved["rl_reward.png"].axes if a.get_title() == "format penalty and policy KL"]
    [kl_ax] = [
        a for a in saved["rl_reward.png"].axes if a is not penalty_ax and a.bbox.bounds == penalty_ax.bbox.bounds
    ]
    assert [line.get_label() for line in kl_ax.get_lines()] == ["GRPO KL (right axis)"]
    assert [line.get_label() for line in penalty_ax.get_lines()] == ["penalty"]
    assert kl_ax.get_ylim()[1] < 0.1


def test_each_figure_names_its_run_and_stage_explains_its_symbols_and_carries_the_caveat(tmp_path, monkeypatch):
    """A PNG is often looked at alone (a chat, a slide): what it shows must be on it."""
    from matplotlib.figure import Figure

    rows = [{"stage": "sft", "step": 1, "loss": 2.0}]
    rows += [{"stage": "rl", "step": s, "reward": -1.0, "r_ss": -1.0, "r_kl": 0.1, "kl_mean": 0.1} for s in (1, 2)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts: dict[str, list[str]] = {}
    real_savefig = Figure.savefig

    def keep(fig, path, *a, **kw):
        texts[path.name] = [fig.get_suptitle()] + [t.get_text() for t in fig.texts]
        texts[path.name] += [t.get_text() for ax in fig.axes for leg in [ax.get_legend()] if leg for t in leg.texts]
        return real_savefig(fig, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    make_plots(metrics, tmp_path / "plots", "smollm2-local", "note: 6 RL steps: too few for the reward to trend")
    assert set(texts) == {"rl_reward.png", "rl_step_time.png", "sft_loss.png"}
    for name, said in texts.items():
        stage = name.split("_")[0]
        assert said[0].startswith(f"smollm2-local · {stage}:"), said[0]
        assert any("too few for the reward to trend" in t for t in said), name
    reward = " ".join(texts["rl_reward.png"])
    # every symbol the panels use is said in words somewhere on the figure
    for symbol, words in (("λ", "spec.stages.rl.reward.lambda"), ("α", "reward.alpha"), ("log-prob", "natural log")):
        assert symbol in reward and words in reward, symbol
    assert not any(s in reward for s in ("ℓ", "Δ", " CE")), reward
