"""A campaign's per-level configs: composed into one level-conditional config that resolves as chosen."""

from kinv.agent.campaign.levels import compose, per_level, with_params
from kinv.agent.plan_file import load_plan
from kinv.agent.tools.runners.space import feasibility, space_configs
from kinv.kernels.launch_config import config_hash

PLAN = "plans/7-decode-ceiling.yaml"


def _plan():
    return load_plan(PLAN)[0]


def test_compose_resolves_every_level_to_its_choice_and_covers_the_batches_between():
    plan = _plan()
    a = plan.adapter
    bt64 = a.validate_config({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 8, "num_stages": 3})
    bt32 = a.validate_config({"kernel": "mla_decode", "BLOCK_T": 32, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2})
    keys = [lv.key for lv in plan.levels()]  # b1 b8 b32 b64 b96
    choice = {keys[0]: bt64, keys[1]: bt32, keys[2]: bt64, keys[3]: bt64, keys[4]: bt64}
    cfg = compose(plan, choice)
    got = per_level(plan, cfg)
    assert all(config_hash(got[k]) == config_hash(choice[k]) for k in keys)
    # the most common choice is the base; b8's override spans b2..b8, so batch 5 runs BT32 too
    assert cfg["BLOCK_T"] == 64 and cfg["overrides"] == [{"batch_min": 2, "batch_max": 8, "BLOCK_T": 32,
                                                          "num_warps": 4, "num_stages": 2}]  # fmt: skip
    assert a.params_for(cfg, a.level({**plan.levels()[1].dims, "batch": 5}))["BLOCK_T"] == 32
    assert a.params_for(cfg, a.level({**plan.levels()[1].dims, "batch": 9}))["BLOCK_T"] == 64


def test_one_choice_everywhere_composes_to_a_plain_config():
    plan = _plan()
    base = {**plan.baseline, "kernel": "mla_decode"}
    assert compose(plan, per_level(plan, base)) == plan.adapter.validate_config(base)


def test_a_candidate_keeps_the_incumbents_other_tunables_per_level():
    plan = _plan()
    a = plan.adapter
    inc = a.validate_config({"kernel": "mla_decode", "BLOCK_T": 64, "BLOCK_H": 16, "num_warps": 8, "num_stages": 3,
                             "overrides": [{"batch_max": 1, "BLOCK_T": 32}]})  # fmt: skip
    cand = with_params(plan, inc, {"num_stages": 2})
    got = per_level(plan, cand)
    b1, b64 = plan.levels()[0].key, plan.levels()[3].key
    assert (got[b1]["BLOCK_T"], got[b1]["num_stages"]) == (32, 2)
    assert (got[b64]["BLOCK_T"], got[b64]["num_stages"]) == (64, 2)


def test_the_space_prunes_what_the_resource_model_rules_out_before_any_gpu_time():
    plan = _plan()
    configs = space_configs(plan)
    assert len(configs) == 4 * 2 * 3
    infeasible = [c for c in configs if not feasibility(plan, c)[0]]
    # a 128-token tile without pipelining needs 272 KB of shared memory; an H100/H200 block has 227 KB
    assert {(c["BLOCK_T"], c["num_stages"]) for c in infeasible} == {(128, 1)}
    assert "shared memory" in feasibility(plan, infeasible[0])[1]
