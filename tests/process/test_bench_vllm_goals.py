"""tools.bench_vllm's verdicts on its goals, without an engine: a goal is met only when
every round of two or more meets it, and a goal whose level was not run is left out (a
run of other levels once raised KeyError at its end, after all its measuring)."""

from __future__ import annotations

import math

from tools.bench_vllm_report import GOALS, goals_of


def figure(ratios: list[float]) -> dict:
    return {"label": "a figure", "ratios": {"direct": ratios}}


def test_a_goal_whose_level_was_not_run_is_left_out():
    goals = goals_of({"cpu_per_token": figure([0.25, 0.28])})
    assert set(goals["direct"]) == {"cpu_per_token"} != set(GOALS)
    assert goals["direct"]["cpu_per_token"]["verdict"] == "met"


def test_met_only_when_every_round_meets_it():
    said = {
        tuple(r): goals_of({"ttft_p50": figure(r)})["direct"]["ttft_p50"]["verdict"]
        for r in ([0.8, 0.85], [0.8, 0.95], [0.95, 1.0], [0.8], [math.nan, math.nan])
    }
    assert said[(0.8, 0.85)] == "met"
    assert said[(0.8, 0.95)] == "undecided (the rounds straddle the goal)"
    assert said[(0.95, 1.0)] == "not met"
    assert said[(0.8,)] == "undecided (one round)"
    assert said[(math.nan, math.nan)] == "no figure"
