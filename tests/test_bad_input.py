"""What a newcomer gets wrong: every bad input is a clear error naming what is wrong, before anything runs,
and the command line never ends in a traceback. Tiny random models only (fast)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import make_tiny_target, one_thread, write_char_tokenizer
from spec_helpers import make_drafter, make_target
from treeflash import LLM, SamplingParams
import treeflash.cli as cli_module
from treeflash.cli import default_threads, generate_threads, main

# A template in the usual shape (role, content, a generation prompt) that knows nothing of tools.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}. {% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """A tiny llama with the character tokenizer and a chat template."""
    path = make_tiny_target(tmp_path_factory.mktemp("text") / "m", "llama", vocab_size=64, num_layers=1,
                            tokenizer=True)
    cfg_file = path / "tokenizer_config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "chat_template": CHAT_TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def llm(text_dir) -> LLM:
    return LLM(text_dir, device="cpu")


# --- chat messages ------------------------------------------------------------------------------------
@pytest.mark.parametrize("messages, message", [
    ([{"role": "user"}], r"messages\[0\]: content must be a string, got None"),
    ([{"role": "user", "content": None}], r"messages\[0\]: content must be a string, got None"),
    ([{"role": "user", "content": 5}], r"messages\[0\]: content must be a string, got 5"),
    ([{"role": "system", "content": "hi"}, {"role": "wizard", "content": "hi"}],
     r"messages\[1\]: role must be one of system, user, assistant, got 'wizard'"),
    ([{"role": "tool", "content": "42"}], r"messages\[0\]: this model's chat template does not render tool messages"),
    ([{"content": "no role"}], r"messages\[0\]: role must be one of"),
    ([[{"role": "user", "content": "ok"}], [{"role": "user", "content": "ok"}, "text"]],
     r"messages\[1\]\[1\] must be a dict"),
    ([[{"role": "user", "content": "ok"}], []], r"messages\[1\] must be a non-empty list"),
    (["just a string"], r"messages\[0\] must be a non-empty list"),
    ([], "at least one message"),
    ("a string", "chat takes a list of .* messages .*got str"),
])
def test_bad_chat_messages_are_named_before_templating(llm, messages, message):
    with pytest.raises(ValueError, match=message):
        llm.chat(messages)
    if messages and isinstance(messages, list) and isinstance(messages[0], dict):
        with pytest.raises(ValueError, match=message):
            llm.chat_token_ids(messages)


def test_tool_messages_are_accepted_when_the_template_knows_tools(llm, monkeypatch):
    monkeypatch.setattr(llm.tokenizer, "chat_template", CHAT_TEMPLATE + "{# tool messages render as above #}")
    ids = llm.chat_token_ids([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    assert ids == llm.tokenizer.encode("user a. tool b. assistant ", add_special_tokens=False)


def test_empty_content_is_a_message(llm):
    # OpenAI's API takes "" (an empty system prompt, say); the template renders it as it is.
    ids = llm.chat_token_ids([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}])
    assert ids == llm.tokenizer.encode("system . user hi. assistant ", add_special_tokens=False)


def test_valid_chat_runs(llm):
    out = llm.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                   {"temperature": 0, "max_tokens": 3, "ignore_eos": True}, use_tqdm=False)[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("system be brief. user hi. assistant ",
                                                        add_special_tokens=False)
    assert len(out.token_ids) == 3


# --- sampling params ----------------------------------------------------------------------------------
def test_a_dict_of_sampling_fields_is_a_sampling_params(llm):
    as_dict = llm.generate("abc", {"temperature": 0, "max_tokens": 5, "ignore_eos": True}, use_tqdm=False)
    as_params = llm.generate("abc", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert as_dict[0].token_ids == as_params[0].token_ids and len(as_dict[0].token_ids) == 5
    mixed = llm.generate(["abc", "abd"], [{"temperature": 0, "max_tokens": 2, "ignore_eos": True},
                                          SamplingParams(max_tokens=3, ignore_eos=True)],
                         use_tqdm=False)
    assert [len(o.token_ids) for o in mixed] == [2, 3]


@pytest.mark.parametrize("params, message", [
    ({"temperture": 0}, r"sampling_params\[0\] has unknown fields \['temperture'\]; SamplingParams has n, temperature"),
    ({"temperature": -1}, "temperature must be >= 0"),
    ("greedy", "sampling_params must be a SamplingParams, a dict of its fields or a list of those, got str 'greedy'"),
    (0.7, "got float 0.7"),
    ([{"temperature": 0}, "x"], r"sampling_params\[1\] must be a SamplingParams or a dict of its fields, got str"),
    ([SamplingParams()] * 3, "got 3 SamplingParams for 2 prompts"),
])
def test_wrong_sampling_params_say_what_was_passed(llm, params, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["abc", "abd"], params)


# --- stream -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=["a", "b"]), "stream takes one prompt .a string or a vLLM prompt dict., got list; use generate"),
    (dict(prompt=("a",)), "stream takes one prompt .a string or a vLLM prompt dict., got tuple"),
    (dict(prompt_token_ids=[[1, 2], [3, 4]]), "stream takes one prompt: prompt_token_ids=.id, ...., not a list"),
    (dict(prompt="a", sampling_params=[SamplingParams()]), "stream takes one SamplingParams"),
    (dict(prompt="abc", prompt_token_ids=[5, 6]), "not both or neither"),  # the text was dropped, silently
    (dict(), "not both or neither"),
])
def test_stream_refuses_several_prompts(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm.stream(**kwargs)  # when called, not when first read


def test_sampling_params_changed_after_construction_are_checked_again(llm):
    changed = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    changed.stop = "b"  # a str: one stop string, not one per character
    fresh = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=["b"])
    assert llm.generate("abc", changed)[0].token_ids == llm.generate("abc", fresh)[0].token_ids
    changed.max_tokens = 0
    with pytest.raises(ValueError, match=r"sampling_params\[0\]: max_tokens must be at least 1"):
        llm.generate("abc", changed)


def test_numpy_and_torch_integers_are_sampling_integers():
    np = pytest.importorskip("numpy")
    p = SamplingParams(seed=np.int64(3), top_k=torch.tensor(5), max_tokens=np.int32(7), temperature=np.float32(0.5))
    assert (p.seed, p.top_k, p.max_tokens, p.temperature) == (3, 5, 7, 0.5)
    assert all(type(v) in (int, float) for v in (p.seed, p.top_k, p.max_tokens, p.temperature))
    with pytest.raises(ValueError, match="top_k must be an integer"):
        SamplingParams(top_k=2.0)


def test_numpy_and_torch_integers_are_stop_token_ids_too():
    np = pytest.importorskip("numpy")
    assert SamplingParams(stop_token_ids=[np.int64(2), torch.tensor(3), 4]).stop_token_ids == [2, 3, 4]
    for bad in ([True], [1.0], [-1], 5, [torch.tensor([1, 2])]):
        with pytest.raises(ValueError, match="stop_token_ids must be a list of non-negative token ids"):
            SamplingParams(stop_token_ids=bad)


def test_arguments_of_the_wrong_type_are_value_errors_that_name_them(llm, text_dir):
    # Each was a TypeError from inside ("'int' object is not iterable", "expected str, bytes or os.PathLike").
    for call, message in ((lambda: llm.generate(5), "prompts must be a string or a list of strings"),
                          (lambda: llm.generate(prompt_token_ids=5), "prompt_token_ids must be a list of token-id"),
                          (lambda: llm.stream(prompt_token_ids=5), "prompt_token_ids must be a list of token ids"),
                          (lambda: LLM(5), "model must be a path"),
                          (lambda: LLM(text_dir, draft_model=5), "draft_model must be a path")):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_dtype_treeflash_cannot_run_is_refused_before_loading(text_dir):
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLM(text_dir, device="cpu", dtype=torch.int8)



def test_stream_takes_a_dict_and_token_ids(llm):
    chunks = list(llm.stream(prompt_token_ids=[1, 2, 3], sampling_params={"temperature": 0, "max_tokens": 4,
                                                                          "ignore_eos": True}))
    assert len(chunks[-1].output.token_ids) == 4


# --- progress --------------------------------------------------------------------------------------
class FakeBar:
    """Records what the progress bar is told (tqdm draws nothing when not writing to a terminal)."""

    def __init__(self, total, **kwargs):
        self.total, self.n, self.postfixes = total, 0, []
        FakeBar.last = self

    def set_postfix_str(self, text, refresh=True):
        self.postfixes.append(text)

    def update(self, n):
        self.n += n

    def refresh(self):
        pass

    def close(self):
        pass


def test_progress_bar_counts_requests_tokens_and_tokens_per_second(llm, monkeypatch):
    import treeflash.progress

    monkeypatch.setattr("tqdm.tqdm", FakeBar)
    monkeypatch.setattr(treeflash.progress, "REDRAW_SECONDS", 0.0)  # draw after every step
    outs = llm.generate(["ab", "cd"], [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 9)])
    bar = FakeBar.last
    assert bar.total == 2 and bar.n == 2
    assert bar.postfixes[-1].startswith(f"{sum(len(o.token_ids) for o in outs)} tokens, ")
    assert bar.postfixes[-1].endswith(" tokens/s")
    # A long single request shows its tokens as they come, long before it finishes.
    llm.generate("ab", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    counts = [int(p.split()[0]) for p in FakeBar.last.postfixes]
    assert counts[0] < 6 and counts[-1] == 6 and counts == sorted(counts)


# --- device and tree budget ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["tpu", "mps", 3.5, "cuda:x"])
def test_unknown_device_is_refused(text_dir, device):
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        LLM(text_dir, device=device)


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """A target with an 8-token vocabulary and a block-3 drafter: 8 + 64 = 72 distinct draft prefixes."""
    root = tmp_path_factory.mktemp("budget")
    target = make_target(root / "target", vocab=8, hidden=16, layers=2, heads=2, kv_heads=1, intermediate=16)
    write_char_tokenizer(target, 8)  # characters " abcdef"
    return target, make_drafter(root / "drafter", target, block_size=3)


def test_tree_budget_above_the_maximum_is_refused_before_loading(tmp_path):
    # No model directory exists here: the budget is refused before anything is read.
    with pytest.raises(ValueError, match="tree_budget must be at most 4096, got 1000000"):
        LLM(tmp_path / "nowhere", draft_model=tmp_path / "nowhere", tree_budget=10 ** 6)


def test_tree_budget_is_lowered_to_the_distinct_prefixes(small_vocab_pair):
    target, drafter = small_vocab_pair
    with pytest.warns(UserWarning, match="tree_budget=1000 lowered to 72: a 2-token draft block over a 8-token"):
        llm = LLM(target, device="cpu", draft_model=drafter, tree_budget=1000)
    assert llm.spec.tree_budget == 72
    plain = LLM(target, device="cpu")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = plain.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params, use_tqdm=False)[0].token_ids
    assert llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params, use_tqdm=False)[0].token_ids == want


@pytest.mark.parametrize("spec, drafts", [("dflash", "one chain"), ("none", "nothing")])
def test_a_tree_budget_without_a_tree_is_said_to_be_ignored(small_vocab_pair, spec, drafts):
    target, drafter = small_vocab_pair
    with pytest.warns(UserWarning, match=f"tree_budget=8 is ignored: it sizes DDTree's draft tree, and "
                                         f"spec='{spec}' drafts {drafts}"):
        LLM(target, device="cpu", draft_model=drafter, spec=spec, tree_budget=8)


def test_a_budget_that_fits_is_kept(small_vocab_pair, recwarn):
    target, drafter = small_vocab_pair
    assert LLM(target, device="cpu", draft_model=drafter, tree_budget=72).spec.tree_budget == 72
    assert not [w for w in recwarn if "tree_budget" in str(w.message)]


# --- long prompts -------------------------------------------------------------------------------------
def test_over_long_prompt_is_one_clear_error_without_the_tokenizer_warning(text_dir):
    llm = LLM(text_dir, device="cpu", max_model_len=32)
    llm.tokenizer.model_max_length = 16  # shorter than the prompts: transformers would warn
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("transformers").addHandler(handler)  # where transformers' own handler sits
    try:
        with pytest.raises(ValueError, match="prompt 0 has 40 tokens; max_model_len is 32"):
            llm.generate("a" * 40)
        with pytest.raises(ValueError, match="prompt 0 has 57 tokens; max_model_len is 32"):  # with the template
            llm.chat([{"role": "user", "content": "a" * 40}])
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [r for r in records if "Token indices sequence length" in r.getMessage()]


# --- the command line ---------------------------------------------------------------------------------
def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--device", "tpu"], "device must be 'cpu' or 'cuda'"),
    (["generate", "hi", "--model", "MISSING_KEY"], "required key 'num_attention_heads' is missing"),
    (["generate", "hi", "--model", "TEXT", "--draft-model", "TEXT", "--tree-budget", "5000"],
     "tree_budget must be at most 4096"),
    (["generate", "hi", "--model", "TEXT", "--presence-penalty", "3"], "presence_penalty must be in [-2, 2]"),
    (["convert", "TMP"], "is a directory, not a GGUF file"),
    (["convert", "TMP/none.gguf"], "GGUF file not found"),
])
def test_cli_errors_are_one_line_without_traceback(capsys, tmp_path, text_dir, args, message, monkeypatch):
    monkeypatch.delenv("TREEFLASH_DEBUG", raising=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "vocab_size": 100}')
    names = {"MISSING_KEY": str(tmp_path / "bad"), "TEXT": str(text_dir), "TMP": str(tmp_path)}
    args = [names.get(a, a.replace("TMP", str(tmp_path))) for a in args]
    code, _, err = cli(capsys, *args)
    assert code == 1 and message in err and "Traceback" not in err
    assert err.startswith("treeflash: error: ") and err.count("\n") == 1


def test_cli_warnings_of_ours_are_one_line(capsys, small_vocab_pair, monkeypatch):
    monkeypatch.delenv("TREEFLASH_DEBUG", raising=False)
    target, drafter = small_vocab_pair
    code, _, err = cli(capsys, "generate", "ab", "--model", str(target), "--draft-model", str(drafter),
                       "--spec", "dflash", "--tree-budget", "8", "--max-tokens", "2", "--temperature", "0")
    assert code == 0
    assert err.splitlines()[0] == ("treeflash: warning: tree_budget=8 is ignored: it sizes DDTree's draft tree, "
                                   "and spec='dflash' drafts one chain")
    assert "UserWarning" not in err


def test_cli_unexpected_errors_are_one_line_too_and_debug_shows_the_traceback(capsys, monkeypatch):
    import treeflash.cli as cli_module

    def broken(args):
        raise KeyError("surprise")

    monkeypatch.setattr(cli_module, "_convert", broken)
    monkeypatch.delenv("TREEFLASH_DEBUG", raising=False)
    code, _, err = cli(capsys, "convert", "x.gguf")
    assert code == 1 and err == "treeflash: error: KeyError: 'surprise' (run with --debug for the traceback)\n"
    for argv in (["--debug", "convert", "x.gguf"], ["convert", "x.gguf", "--debug"]):
        with pytest.raises(KeyError):
            main(argv)
    monkeypatch.setenv("TREEFLASH_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["convert", "x.gguf"])


def test_serve_says_which_options_to_lower_when_the_warm_up_runs_out_of_memory(capsys, monkeypatch):
    # A fixed tree budget too large for the slots runs the GPU out of memory in the warm-up, before the server
    # listens: one line naming the options, no traceback, and the server never starts.
    import types

    import treeflash
    import treeflash.server

    class OutOfMemoryLLM:
        def __init__(self, *args, max_num_seqs, tree_budget, **kwargs):
            self.device, self.max_num_seqs = torch.device("cuda"), max_num_seqs
            self.spec = types.SimpleNamespace(method="ddtree", tree_budget=tree_budget)
            self.default_sampling, self.tokenizer = {}, None

        def warm_up(self):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(treeflash, "LLM", OutOfMemoryLLM)
    monkeypatch.setattr(treeflash.server, "serve", lambda *a, **k: pytest.fail("the server must not start"))
    code, _, err = cli(capsys, "serve", "--tree-budget", "512", "--max-num-seqs", "32")
    lines = err.splitlines()  # the warm-up's first line, then the error
    assert code == 1 and len(lines) == 2 and lines[1].startswith("treeflash: error: ") and "Traceback" not in err
    assert "out of GPU memory capturing the CUDA graphs of 32 slots at tree budget 512" in err
    assert "lower --max-num-seqs, --tree-budget" in err and "Tried to allocate 3.00 GiB" in err
    code, _, err = cli(capsys, "serve", "--max-num-seqs", "32")  # auto: nothing to say about the budget
    assert code == 1 and "lower --max-num-seqs or --max-model-len" in err


def test_cli_system_implies_chat(capsys, text_dir):
    code, out, err = cli(capsys, "generate", "hi", "--system", "be brief", "--model", str(text_dir),
                         "--temperature", "0", "--max-tokens", "4", "--ignore-eos")
    assert code == 0, err
    llm = LLM(text_dir, device="cpu")
    ids = llm.chat_token_ids([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    want = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(temperature=0, max_tokens=4,
                                                                              ignore_eos=True), use_tqdm=False)
    assert out == want[0].text + "\n"


def test_cli_summary_for_plain_decoding_and_show_tree_without_a_drafter(capsys, text_dir):
    code, out, err = cli(capsys, "generate", "hi", "--model", str(text_dir), "--temperature", "0",
                         "--max-tokens", "3", "--ignore-eos", "--show-tree")
    assert code == 0, err
    assert "no draft tree: plain decoding" in err and "last round's draft tree" not in out
    summary = err.splitlines()[-2]  # the stages line follows
    assert summary.startswith("[none] 3 tokens in ") and "tokens/s), finish reason: length" in summary
    assert "round" not in err and "acceptance" not in err
    assert "draft" not in err.splitlines()[-1].split("stages:")[1]


def test_cli_summary_counts_tokens_and_rounds_in_english(capsys, small_vocab_pair):
    target, drafter = small_vocab_pair
    code, _, err = cli(capsys, "generate", "abc", "--model", str(target), "--draft-model", str(drafter),
                       "--temperature", "0", "--max-tokens", "5", "--ignore-eos", "--tree-budget", "4")
    assert code == 0, err
    summary = err.splitlines()[-2]
    assert summary.startswith("[ddtree + lookup 8] 5 tokens in ") and "finish reason: length; " in summary
    assert " round, mean acceptance length " in summary or " rounds, mean acceptance length " in summary
    assert "draft" in err.splitlines()[-1]  # the stages line times the draft
    # Sampled on the CPU, a round verifies no lookup row (SpecConfig.ngram_sampled): the summary does not name it.
    code, _, err = cli(capsys, "generate", "abc", "--model", str(target), "--draft-model", str(drafter),
                       "--temperature", "0.8", "--max-tokens", "3", "--ignore-eos", "--tree-budget", "4")
    assert code == 0 and err.splitlines()[-2].startswith("[ddtree] 3 tokens in "), err
    from treeflash.cli import summary_line
    from treeflash.outputs import RequestMetrics, RequestOutput

    out = RequestOutput(0, "x", [1], [2, 3, 4], "", "length", RequestMetrics(1, 3, acceptance_lengths=[2]))
    assert "; 1 round, mean acceptance length 2.00" in summary_line("ddtree", out, 1.0)
    out.metrics.acceptance_lengths = [1, 1]
    assert "; 2 rounds, mean acceptance length 1.00" in summary_line("dflash", out, 1.0)
    assert "auto budgets" not in summary_line("dflash", out, 1.0)
    out.metrics.round_budgets = [8, 0]  # tree_budget="auto": what it chose, counted
    assert "mean acceptance length 1.00; auto budgets: 0 x1, 8 x1" in summary_line("ddtree", out, 1.0)
    out.metrics.num_generated_tokens = 1
    assert summary_line("none", out, 1.0).startswith("[none] 1 token in 1.00 s (1.0 tokens/s)")
    assert "round" not in summary_line("none", out, 1.0)
    # Prompt lookup (the default with a drafter) is named, and makes plain decoding's rounds worth counting.
    assert summary_line("ddtree", out, 1.0, 8).startswith("[ddtree + lookup 8] 1 token")
    assert "; 2 rounds, mean acceptance length 1.00" in summary_line("none", out, 1.0, 4)


def test_default_threads_is_bounded_and_follows_omp(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert 1 <= default_threads() <= 4


def test_generate_takes_the_cores_other_processes_leave_idle(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cli_module, "_usable_cores", lambda: 6)
    assert default_threads() == 3
    assert generate_threads(0.0) == 4  # an idle machine: every core, up to 4
    assert generate_threads(3.9) == 3  # 2.1 idle cores: never fewer than half the usable ones
    assert generate_threads(1.9) == 4 and generate_threads(2.3) == 3
    assert generate_threads(None) == 3  # nothing measured
    monkeypatch.setattr(cli_module, "_usable_cores", lambda: 2)
    assert generate_threads(0.1) == 2 and generate_threads(0.3) == 1 and generate_threads(1.0) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert generate_threads(0.0) == 5


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="measured from /proc/stat (Linux)")
def test_other_cpu_use_counts_another_process_and_not_this_one():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # (its interpreter started)
        use = cli_module.OtherCpuUse()
        end = time.monotonic() + 0.6
        while time.monotonic() < end:  # this process busy too: not counted
            pass
        assert use.cores() >= 0.3
    finally:
        busy.wait()


def run_python(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` with this checkout first on the path (as pytest imports it)."""
    path = [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env)


def test_help_and_version_do_not_import_torch():
    probe = ("import sys, contextlib, io\n"
             "from treeflash.cli import main\n"
             "codes = []\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    codes.append(main(['--version']))\n"
             "    for argv in (['--help'], ['generate', '--help'], ['convert', '--help']):\n"
             "        try:\n"
             "            main(argv)\n"
             "        except SystemExit as e:\n"
             "            codes.append(e.code)\n"
             "print(codes, 'torch' in sys.modules)\n")
    result = run_python("-c", probe)
    assert result.stdout.strip() == "[0, 0, 0, 0] False", result.stderr


def test_python_dash_m_treeflash_runs_the_cli():
    result = run_python("-m", "treeflash", "--version")
    assert result.returncode == 0 and result.stdout.strip() == __import__("treeflash").__version__
    result = run_python("-m", "treeflash", "generate", "x", "--device", "tpu")
    assert result.returncode == 1 and result.stderr.startswith("treeflash: error: device must be")


# --- detokenize=False ---------------------------------------------------------------------------------
def test_detokenize_false_gives_the_same_tokens_and_no_text(llm):
    """Token ids only (what training data needs): the same tokens, no text, stop strings refused."""
    kept = llm.generate(["abc", "hello"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    bare = llm.generate(["abc", "hello"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                         detokenize=False))
    assert [o.token_ids for o in bare] == [o.token_ids for o in kept]
    assert all(o.text == "" for o in bare) and all(o.text for o in kept)
    with pytest.raises(ValueError, match="stop strings need detokenize=True"):
        SamplingParams(stop=["x"], detokenize=False)
    with pytest.raises(ValueError, match="detokenize must be a bool"):
        SamplingParams(detokenize="no")
