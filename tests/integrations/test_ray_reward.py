"""The generated reward_func.py inside real Ray actors on a local CPU cluster: 2 actors, 1 000 scored samples.

OpenRLHF loads the file in its vLLM Ray actors (``RolloutRayActor``) and calls it once per sample from a thread;
here two plain actors load it the same way (``importlib.util.spec_from_file_location("reward_func", path)``) and
score 500 samples each, one call per sample, from a thread pool. Every reward must equal ``lrmgym judge``'s.
Ray runs on this machine only (``ray.init(num_cpus=2, include_dashboard=False)``), started and shut down here.
"""

from __future__ import annotations

import json
import sys

import pytest
from integration_helpers import reference_rewards

from lrmgym.configs.resolve import resolve
from lrmgym.integrations.labels import decode_label, write_data
from lrmgym.integrations.openrlhf_plugins import write_plugins

ray = pytest.importorskip("ray")

SAMPLES = 1000


class _RewardActor:
    """What a vLLM rollout actor does with ``--reward.remote_url reward_func.py``."""

    def __init__(self, path: str) -> None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("reward_func", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.reward_func = module.reward_func

    def score(self, batch: list[tuple[str, str, str]]) -> list[tuple[float, float]]:
        from concurrent.futures import ThreadPoolExecutor

        def one(item: tuple[str, str, str]) -> tuple[float, float]:
            query, prompt, label = item
            out = self.reward_func([query], [prompt], [label])
            return out["rewards"].item(), out["scores"].item()

        with ThreadPoolExecutor(4) as pool:  # OpenRLHF: asyncio.to_thread, one call per sample
            return list(pool.map(one, batch))


def test_reward_func_in_ray_actors(tmp_path):
    cfg = resolve(["env=math", "judge=[accuracy,format_strict]"])
    data = write_data(cfg, tmp_path, SAMPLES // 4, 0)
    path = write_plugins(cfg, tmp_path)["reward_func"]
    rows = [json.loads(line) for line in data["train"].read_text().splitlines()]
    env = cfg.env.make()
    items, groups = [], []
    for row in rows:
        label = decode_label(row["label"])
        task = env.task_at(label.index, seed=label.seed)
        texts = [task.metadata["solution"], "<think>1+1=3</think><answer>-1</answer>",
                 "<think>x</think><answer>" + str(task.answer) + "</answer> and more", "\x00\udcff"]  # fmt: skip
        groups.append((task, texts))
        items += [(row["prompt"] + t + "<eos>", row["prompt"], row["label"]) for t in texts]
    assert len(items) == SAMPLES
    expected = [r for g in reference_rewards(cfg, groups, tmp_path) for r in g]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:  # the workers cannot import this test module: ship the actor class by value
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        actor = ray.remote(num_cpus=1)(_RewardActor)
        actors = [actor.remote(str(path)) for _ in range(2)]
        halves = [items[: SAMPLES // 2], items[SAMPLES // 2 :]]
        # A generous timeout: a loaded CI machine is slow, not wrong.
        results = ray.get([a.score.remote(h) for a, h in zip(actors, halves, strict=True)], timeout=900)
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    got = [r for half in results for r in half]
    assert len(got) == SAMPLES
    assert [r for r, _ in got] == expected
    assert sum(s for _, s in got) == len(rows)  # exactly the worked solutions are correct
