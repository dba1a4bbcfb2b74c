"""``lrmgym/Code-v0``: Python programming tasks graded by unit tests run in an isolated sandbox.

Modules: :mod:`~lrmgym.envs.code.env` (the env), :mod:`~lrmgym.envs.code.sandbox` (isolation and the
pool), :mod:`~lrmgym.envs.code.harness` (the in-sandbox grader the candidate cannot forge),
:mod:`~lrmgym.envs.code.loaders` (HumanEval, MBPP, JSONL), :mod:`~lrmgym.envs.code.heldout` (the tests graded
instead of those the prompt shows), :mod:`~lrmgym.envs.code.procedural` (generated tasks),
:mod:`~lrmgym.envs.code.extract` (code extraction).

What a candidate program can and cannot reach
=============================================
The candidate is hostile: trained by RL, it searches for whatever the reward pays. Two things are
defended: the host (isolation) and the reward (integrity). Tests for every line below are in
``tests/envs/code/test_code_adversarial.py`` (host), ``test_code_integrity.py`` and the reward-hacking
battery (:mod:`lrmgym.testing.reward_hacking`, run in CI).

**It runs as** process ``C`` in a fresh sandbox used for this one job and then killed: a dedicated
unprivileged uid per pool slot (so ``RLIMIT_NPROC`` binds even when the trainer is root), no
capabilities, ``no_new_privs``, rlimits on CPU, memory, file size, open files and processes, and a
wall-clock deadline enforced from outside (SIGKILL of the whole tree).

**It can reach:** its own program text; for call-mode tasks, the *inputs* the tests pass to its entry
points, one call at a time; for stdio tasks, its own case's stdin; a size-capped private tmpfs work dir
(bubblewrap) or private ``/tmp`` (unshare fallback); CPU and memory up to its limits; its own output,
which the grader keeps up to the output cap and shows back in multi-turn feedback only with ``feedback=full``.

**It cannot reach, and why:**

- *The network, the trainer's loopback services (vLLM, Ray, reward servers), other processes*: net, pid,
  ipc and uts namespaces (both backends). Without namespaces (the explicit ``process`` backend) this is
  not true, and the pool says so.
- *Host files*: with bubblewrap the root is built only from read-only binds of what Python needs; with
  the unshare fallback, host folders that hold data and secrets are covered with empty tmpfs, but
  ``/etc`` and ``/usr`` stay readable with "other" permissions (logged when the pool starts).
- *Secrets in the environment*: the sandbox gets a cleared environment.
- *The tests' expected values*: ``C`` is forked before the harness reads the tests, so its memory never
  held them. Asserts run in the harness process ``H``, which ``C`` cannot ptrace or read
  (``PR_SET_DUMPABLE`` 0). In stdio mode expected outputs never enter the sandbox at all (the parent
  compares), and each case's ``C`` is forked by a zygote that never read a case. Multi-turn feedback by
  default reports failure kinds only (``feedback=errors_only``; see :class:`~lrmgym.envs.code.env.CodeConfig`),
  never the program's own output (echoed inputs plus per-test verdicts are a lookup table).
- *The tests the prompt shows*: a HumanEval/MBPP/procedural prompt shows examples; the env grades on tests it
  does not show (:mod:`~lrmgym.envs.code.heldout`), so a lookup table of the shown ones earns nothing.
- *The grader's code or namespace*: ``H`` decodes only plain builtin data from ``C`` (every other object,
  modules included, stays an opaque handle; ``H`` imports nothing ``C`` named, and itself imports the modules
  the tests name, so a fake ``sys`` of ``C`` never reaches them), imports lazily only from
  folders ``C`` cannot write, and runs the tests in a namespace of its own builtins, the trusted prelude
  and only the candidate's entry points, so defining ``abs``, ``sorted`` or a prompt helper changes
  nothing an assert computes. Exceptions rebuilt from ``C`` never carry control flow (``StopIteration``),
  and a timeout or crash of ``C`` cannot be swallowed by a test's ``except``.
- *The result*: only ``H`` holds the result channel (with bubblewrap ``H`` is the sandbox's pid 1: no reaper
  process holds the sandbox's stdio for ``C`` to take with ``pidfd_getfd`` or ``ptrace``). The parent parses
  the record with a bounded, schema-checked reader (no ``marshal``/``pickle``), takes the test count from the
  job it sent, counts passes itself, refuses any status only it can decide (``infra``, ``killed``), and scores
  every malformed record 0 (``protocol``), never ungradeable: only a sandbox that failed to start is ours.

**What it can still do:** waste its own time and memory up to the limits (scored 0), and, when tests
compare against values the candidate can compute itself, pass them honestly.
"""
