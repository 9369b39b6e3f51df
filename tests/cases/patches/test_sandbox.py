"""Static allow-list, safe compile and in-process fuzzing of patch code (the corpus lives in test_patch_check)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remedy.cases.errors import PatchRejectedError, SandboxError
from remedy.cases.patches.sandbox import (
    ALLOWED_NUMPY,
    FuzzReport,
    check_code,
    compile_predicate,
    compile_reward,
    fuzz_predicate,
    fuzz_reward,
)

SIG = "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info):\n"
ARGS = (np.zeros(3), np.zeros(1), 1.0, np.ones(3), False, False, {})


def reward_code(*lines: str, head: str = "") -> str:
    return head + SIG + "".join(f"    {line}\n" for line in lines)


def rule_of(code: str, **kw) -> str:
    with pytest.raises(PatchRejectedError) as info:
        check_code(code, **kw)
    return info.value.rule


# --------------------------------------------------------------------------- what is allowed


def test_typical_llm_reward_code_is_accepted_and_runs():
    code = (
        '"""Shaping for a reacher."""\n'
        "import numpy as np\nimport math\nfrom math import sqrt, pi\n"
        "GOAL = np.array([0.0, 1.0])\nEPS = 1e-6\nWEIGHTS = {'dist': 0.5, 'effort': 0.1}\nSCALE = 2 * EPS\n\n"
        "def _dist(a: np.ndarray, b) -> float:\n    return float(np.linalg.norm(a - b))\n\n"
        "def shaped_reward(obs: np.ndarray, action, reward: float, next_obs, terminated, truncated, info) -> float:\n"
        "    d = _dist(np.clip(next_obs[:2], -10, 10), GOAL)\n"
        "    bonus = 1.0 / (d + EPS) if d < 0.1 else 0.0\n"
        "    effort = sum(float(a) ** 2 for a in np.ravel(action))\n"
        "    parts = [x for x in (d, effort) if math.isfinite(x)]\n"
        "    try:\n        ratio = d / effort\n    except ZeroDivisionError:\n        ratio = 0.0\n"
        "    total = 0.0\n    for i, p in enumerate(parts):\n        total += p * (i + 1)\n"
        "    return float(reward) - WEIGHTS['dist'] * d - WEIGHTS['effort'] * effort + min(bonus, 10.0) + 0 * ratio + 0 * sqrt(pi) + info.get('x', 0.0)\n"
    )
    check_code(code)
    fn = compile_reward(code)
    value = fn(np.zeros(2), np.ones(1), 1.0, np.array([0.0, 1.0]), False, False, {})
    assert isinstance(value, float) and np.isfinite(value)


def test_allow_list_leaves_out_io_ctypes_and_internals():
    forbidden = {
        "load",
        "save",
        "savez",
        "fromfile",
        "tofile",
        "memmap",
        "genfromtxt",
        "loadtxt",
        "savetxt",
        "ctypeslib",
        "lib",
        "set_printoptions",
        "frombuffer",
        "random",
        "testing",
        "ndarray",
        "dtype",
        "vectorize",
        "frompyfunc",
        "f2py",
    }
    assert not forbidden & ALLOWED_NUMPY
    assert "clip" in ALLOWED_NUMPY and "linalg" in ALLOWED_NUMPY


def test_the_np_seen_by_patch_code_is_a_proxy_without_io():
    fn = compile_reward(reward_code("return 0.0"))
    np_proxy = fn._fn.__globals__["np"]
    assert not hasattr(np_proxy, "load") and not hasattr(np_proxy, "memmap")
    assert not hasattr(np_proxy.linalg, "inv") and np_proxy.linalg.norm(np.ones(4)) == 2.0
    assert "open" not in fn._fn.__globals__["__builtins__"]


@pytest.mark.parametrize(
    "code, rule",
    [
        (reward_code("x = np", "return float(x.load('f'))"), "attribute-not-allowed:load"),
        (reward_code("return float(np.random.rand())"), "numpy-not-allowed:random"),
        (reward_code("return math.sys"), "math-not-allowed:sys"),
        (reward_code("obs.flags = 1", "return 0.0"), "no-attribute-assignment"),
        (reward_code("try:", "    return 0.0", "except:", "    return 1.0"), "bare-except"),
        (reward_code("while 1:", "    pass", "return 0.0"), "no-while-true"),
        (reward_code("del obs", "return 0.0"), "no-delete"),
        (reward_code("with x:", "    pass", "return 0.0"), "no-with"),
        (reward_code("yield 1.0"), "no-generators"),
        (reward_code("return undefined_thing"), "unknown-name:undefined_thing"),
        (reward_code("return info.get('__x', 0.0)"), "no-dunder"),
        (reward_code("return 0.0", head="X = obs\n"), "top-level-code"),
        (reward_code("return 0.0", head="for i in range(3):\n    pass\n"), "top-level-code"),
        (reward_code("return 0.0", head="X = 'a' * 1000000000\n"), "top-level-code"),
        (reward_code("return 0.0", head="X = np.zeros(10)\n"), "top-level-code"),
        (
            "def shaped_reward(obs, action, reward, next_obs, terminated, truncated, info, *, k):\n    return 0.0\n",
            "bad-signature",
        ),
        ("x = 1\n", "missing-entry"),
        (reward_code("try:", "    return 0.0", "except ValueError as __builtins__:", "    return 1.0"), "no-dunder"),
        (reward_code("return 0.0", head="def open(path):\n    return 0\n"), "forbidden-name:open"),
        (reward_code("return 0.0") + "\x00", "syntax"),
    ],
)
def test_static_rules(code, rule):
    assert rule_of(code) == rule


def test_entry_and_params_are_configurable():
    code = "def my_fn(a, b):\n    return a + b\n"
    check_code(code, entry="my_fn", params=("a", "b"))
    assert rule_of(code, entry="my_fn", params=("a", "b", "c")) == "bad-signature"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text_is_either_accepted_or_refused_with_a_rule(text):
    try:
        check_code(text)
    except PatchRejectedError as err:
        assert err.rule and "\n" not in str(err)


# --------------------------------------------------------------------------- the compiled callables


def test_arrays_arrive_read_only_and_the_callers_arrays_stay_untouched():
    obs = np.array([1.0, 2.0, 3.0])
    fn = compile_reward(reward_code("obs[0] = 99.0", "return 0.0"))
    with pytest.raises(SandboxError, match="read-only"):
        fn(obs, np.zeros(1), 0.0, obs, False, False, {})
    assert obs[0] == 1.0 and obs.flags.writeable
    info = {"pos": np.zeros(2)}
    fn = compile_reward(reward_code("info['pos'][0] = 1.0", "return 0.0"))
    with pytest.raises(SandboxError):
        fn(*ARGS[:-1], info)
    assert info["pos"][0] == 0.0


@pytest.mark.parametrize(
    "ret, reason",
    [
        ("'x'", "non-numeric"),
        ("None", "non-numeric"),
        ("next_obs", "non-numeric"),
        ("float('inf')", "non-finite"),
        ("10 ** 400", "non-numeric"),
    ],
)
def test_results_must_be_one_finite_float(ret, reason):
    fn = compile_reward(reward_code(f"return {ret}"))
    with pytest.raises(SandboxError) as info:
        fn(*ARGS)
    assert info.value.reason == reason


def test_numpy_scalars_ints_and_bools_become_floats():
    for ret, want in (("np.float32(1.5)", 1.5), ("3", 3.0), ("terminated", 0.0), ("np.sum(next_obs)", 3.0)):
        assert compile_reward(reward_code(f"return {ret}"))(*ARGS) == want


def test_exceptions_inside_the_code_become_sandbox_errors():
    fn = compile_reward(reward_code("return 1.0 / float(np.linalg.norm(obs))"))
    with pytest.raises(SandboxError, match="ZeroDivisionError") as info:
        fn(*ARGS)
    assert info.value.reason == "exception"


def test_compiled_functions_pickle_as_their_source():
    fn = compile_reward(reward_code("return float(reward) + 1.0"))
    again = pickle.loads(pickle.dumps(fn))
    assert again(*ARGS) == 2.0 and again.code == fn.code
    pred = pickle.loads(pickle.dumps(compile_predicate("obs[0] > 0.5")))
    assert pred(np.array([1.0]), 0, {}) is True


def test_predicates():
    pred = compile_predicate("abs(float(obs[0])) > 1.0 or info.get('crashed', False)")
    assert pred(np.array([2.0]), np.zeros(1), {}) is True
    assert pred(np.array([0.0]), np.zeros(1), {"crashed": True}) is True
    assert pred(np.array([0.0]), np.zeros(1), {}) is False
    custom = compile_predicate("x > y", names=("x", "y"))
    assert custom(2, 1) is True
    with pytest.raises(SandboxError, match="truth value|shape"):
        compile_predicate("obs > 0")(np.array([1.0, -1.0]), 0, {})


@pytest.mark.parametrize(
    "expr, rule",
    [
        ("__import__('os')", "no-dunder"),
        ("open('/etc/passwd')", "forbidden-name:open"),
        ("True)\nimport os\n(True", "syntax"),
        ("x = 1", "syntax"),
        ("lambda: obs.__class__", "no-dunder"),
        ("undefined > 0", "unknown-name:undefined"),
        ("-" * 500 + "1 > 0", "too-deep"),
    ],
)
def test_predicate_rules(expr, rule):
    with pytest.raises(PatchRejectedError) as info:
        compile_predicate(expr)
    assert info.value.rule == rule


# --------------------------------------------------------------------------- fuzzing (in process; isolation in test_patch_check)


@pytest.fixture(scope="module")
def pendulum_spaces():
    env = gym.make("Pendulum-v1")
    yield env.observation_space, env.action_space
    env.close()


def test_fuzz_accepts_a_robust_reward(pendulum_spaces):
    fn = compile_reward(reward_code("return float(reward) - 0.1 * float(np.sum(np.square(np.clip(action, -2, 2))))"))
    report = fuzz_reward(fn, *pendulum_spaces, n_random=50, isolate=False)
    assert isinstance(report, FuzzReport) and report.ok
    assert report.calls >= 50 + 7 and report.max_call_ms >= 0


def test_fuzz_finds_division_by_zero_at_the_goal(pendulum_spaces):
    fn = compile_reward(reward_code("distance = float(np.linalg.norm(next_obs))", "return 1.0 / distance"))
    with pytest.raises(PatchRejectedError) as info:
        fuzz_reward(fn, *pendulum_spaces, n_random=10, isolate=False)
    assert info.value.rule == "fuzz:exception"
    assert "ZeroDivisionError" in str(info.value) and "obs=action=0" in str(info.value)
    assert info.value.report.problems


def test_fuzz_tolerates_nan_out_for_nan_in_but_not_for_finite_inputs(pendulum_spaces):
    passthrough = compile_reward(reward_code("return float(np.clip(np.sum(next_obs), -1e3, 1e3))"))
    assert fuzz_reward(passthrough, *pendulum_spaces, n_random=10, isolate=False).ok
    overflow = compile_reward(reward_code("return float(np.exp(np.sum(next_obs)))"))
    with pytest.raises(PatchRejectedError) as info:
        fuzz_reward(overflow, *pendulum_spaces, n_random=10, isolate=False)
    assert info.value.rule == "fuzz:non-finite"


def test_fuzz_flags_slow_calls(pendulum_spaces):
    fn = compile_reward(reward_code("s = 0.0", "for i in range(300000):", "    s += i", "return 0.0"))
    with pytest.raises(PatchRejectedError) as info:
        fuzz_reward(fn, *pendulum_spaces, n_random=5, max_call_ms=1.0, isolate=False)
    assert info.value.rule in ("fuzz:slow", "fuzz:timeout")


def test_fuzz_handles_discrete_spaces():
    env = gym.make("FrozenLake-v1")
    fn = compile_reward(reward_code("return float(reward) - 0.01 * float(obs == 15) + 0.001 * int(action)"))
    report = fuzz_reward(fn, env.observation_space, env.action_space, n_random=20, isolate=False)
    assert report.ok and report.calls > 20
    pred = compile_predicate("int(obs) in (5, 7, 11, 12)")
    assert fuzz_predicate(pred, env.observation_space, env.action_space, n_random=20, isolate=False).ok
    env.close()


def test_fuzz_is_deterministic_for_a_seed(pendulum_spaces):
    fn = compile_reward(reward_code("return float(np.clip(next_obs[0] - obs[0], -1, 1))"))
    a = fuzz_reward(fn, *pendulum_spaces, n_random=20, seed=3, isolate=False)
    b = fuzz_reward(fn, *pendulum_spaces, n_random=20, seed=3, isolate=False)
    assert a.calls == b.calls and a.problems == b.problems


# --------------------------------------------------------------------------- no state, no swallowed timer (issue 29)


@pytest.mark.parametrize(
    "code, rule",
    [
        (reward_code("CALLS.append(1)", "return float(len(CALLS))", head="CALLS = []\n"), "mutable-state"),
        (reward_code("return 0.0", head="SEEN = {1, 2}\n"), "mutable-state"),
        (reward_code("S['n'] += 1", "return float(S['n'])", head="S = {'n': 0}\n"), "mutable-state"),
        (reward_code("C[0] = C[0] + 1", "return float(C[0])", head="C = np.array([0.0])\n"), "mutable-state"),
        (SIG.replace("info)", "info, memo=[0])") + "    return 0.0\n", "mutable-state"),
        (reward_code("f = lambda a, cache={}: a", "return 0.0"), "mutable-state"),
        (reward_code("n = 0", "def bump():", "    nonlocal n", "    n += 1", "bump()", "return 0.0"), "no-global"),
        (reward_code("shaped_reward.calls = 1", "return 0.0"), "no-attribute-assignment"),
        (
            reward_code(
                "for i in range(10):", "    try:", "        pass", "    finally:", "        continue", "return 0.0"
            ),
            "no-finally-jump",
        ),
        (reward_code("try:", "    x = 1", "finally:", "    return 0.0"), "no-finally-jump"),
        (
            reward_code(
                "for i in range(3):", "    try:", "        pass", "    finally:", "        break", "return 0.0"
            ),
            "no-finally-jump",
        ),
    ],
)
def test_state_between_calls_and_finally_jumps_are_refused(code, rule):
    with pytest.raises(PatchRejectedError) as info:
        check_code(code)
    assert info.value.rule == rule
    if rule in ("mutable-state", "no-global"):
        assert "function of the transition" in str(info.value)


def test_module_level_constants_stay_usable_but_read_only():
    head = "W = {'dist': 0.5, 'pair': (1, 2)}\nGOAL = np.array([0.0, 1.0])\n"
    ok = compile_reward(reward_code("l = []", "l.append(W['dist'])", "return float(GOAL[1]) + l[0]", head=head))
    assert ok(*ARGS) == 1.5
    alias = compile_reward(reward_code("w = W", "w['dist'] = 1.0", "return 0.0", head=head))
    with pytest.raises(SandboxError, match="does not support item assignment"):
        alias(*ARGS)
    out = compile_reward(reward_code("np.add(GOAL, 1.0, out=GOAL)", "return 0.0", head=head))
    with pytest.raises(SandboxError, match="read-only"):
        out(*ARGS)
    assert ok(*ARGS) == 1.5  # nothing changed between calls


def _fails_on_a_monitor_info(obs, action, reward, next_obs, terminated, truncated, info):
    return float(reward) + 0.01 * info.get("episode", 0.0)  # a dict at SB3 Monitor's episode ends


def test_fuzz_varies_info_and_finds_code_that_breaks_on_real_keys(pendulum_spaces):
    with pytest.raises(PatchRejectedError) as info:
        fuzz_reward(_fails_on_a_monitor_info, *pendulum_spaces, n_random=20, isolate=False)
    assert info.value.rule == "fuzz:exception" and "TypeError" in str(info.value)
    assert "episode end" in str(info.value)  # the label names the info variant


def test_fuzz_makes_thousands_of_calls_by_default(pendulum_spaces):
    calls = {"n": 0}

    def breaks_late(obs, action, reward, next_obs, terminated, truncated, info):  # state the sandbox would refuse
        calls["n"] += 1
        if calls["n"] > 1500:
            raise ValueError("breaks after 1500 calls")
        return 0.0

    with pytest.raises(PatchRejectedError) as info:
        fuzz_reward(breaks_late, *pendulum_spaces, isolate=False)
    assert info.value.rule == "fuzz:exception" and calls["n"] > 1500
    good = compile_reward(reward_code("return float(np.clip(reward, -10, 10)) + 0.0 * float(info.get('cost', 0.0))"))
    infos: list = []
    report = fuzz_reward(lambda *a: infos.append(a[-1]) or good(*a), *pendulum_spaces, isolate=False)
    assert report.ok and report.calls >= 2000
    assert (
        any(not i for i in infos)
        and any("episode" in i for i in infos)
        and any(i.get("debug", 0) is None for i in infos)
    )


def _swallows_the_timer(obs, action, reward, next_obs, terminated, truncated, info):
    """Raw Python (the sandbox refuses this statically): every timer raise is swallowed by finally."""
    x = 0
    for _ in range(10**12):
        try:
            for i in range(10**6):  # nearly all the time is spent inside the try, so nearly every raise lands there
                x += i
        finally:
            continue  # noqa: B012
    return 0.0


def _swallows_once(obs, action, reward, next_obs, terminated, truncated, info):
    try:
        for _ in range(10**12):
            pass
    finally:
        return 0.0  # noqa: B012


def test_a_swallowed_timer_still_ends_the_call(pendulum_spaces):
    with pytest.raises(PatchRejectedError) as info:  # in the worker: the process ends, the problem is named
        fuzz_reward(_swallows_the_timer, *pendulum_spaces, n_random=5, timeout_s=60)
    assert info.value.rule == "fuzz:timeout" and "swallows the timeout" in str(info.value)
    with pytest.raises(PatchRejectedError) as info:  # in process: returning after a raise is still a timeout
        fuzz_reward(_swallows_once, *pendulum_spaces, n_random=5, isolate=False)
    assert info.value.rule == "fuzz:timeout"
