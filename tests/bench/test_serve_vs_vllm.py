"""The serve-vs-vllm benchmark's parts that need no server: its command lines, the client's arguments, the table."""

import pytest

from fairagents.bench import serve_vs_vllm as svv


def test_every_server_runs_the_same_model_context_and_kv():
    config = svv.Path("serve.toml")
    cmds = {s: svv.server_command(s, "/models/tiny", 8000, kv_bytes=2**26, max_model_len=1024, config=config)
            for s in svv.SERVERS}
    plain, fair = cmds["vllm serve"], cmds["vllm serve + FairScheduler"]
    assert fair[: len(plain)] == plain and fair[len(plain):] == ["--scheduler-cls", "fairagents.vllm.FairScheduler"]
    for flag, value in (("--model", "/models/tiny"), ("--max-model-len", "1024"), ("--kv-cache-memory-bytes",
                                                                                    str(2**26))):
        assert plain[plain.index(flag) + 1] == value
    assert cmds["fairagents serve"][1:4] == ["-m", "fairagents", "serve"]
    with pytest.raises(ValueError, match="unknown server"):
        svv.server_command("sglang", "/m", 1, kv_bytes=1, max_model_len=1)
    with pytest.raises(ValueError, match="configuration"):
        svv.server_command("fairagents serve", "/m", 1, kv_bytes=1, max_model_len=1)


def test_the_client_is_vllms_benchmark_parser_with_the_issue_load():
    pytest.importorskip("vllm")
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(svv.client_args("http://127.0.0.1:1", "/m", concurrency=64, num_prompts=400,
                                             input_len=64, output_len=128))
    assert (args.max_concurrency, args.num_prompts, args.random_input_len, args.random_output_len) == (64, 400, 64, 128)
    assert args.ignore_eos and args.endpoint == "/v1/completions" and args.model == "chat"


def test_the_table_shows_each_server_against_vllm_serve():
    row = {"completed": 10, "failed": 0, "output_throughput": 100.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0,
           "mean_tpot_ms": 5.0, "p99_tpot_ms": 6.0, "throughput_vs_vllm": 1.0, "ttft_p99_vs_vllm": 1.0}
    result = {"load": {"num_prompts": 10, "input_len": 64, "output_len": 128, "model": "embedded"},
              "servers": {s: {"64": dict(row)} for s in svv.SERVERS}}
    table = svv.render(result)
    assert table.row_count == 3 and [c.header for c in table.columns][3] == "vs vllm serve"
    with pytest.raises(ValueError, match="unknown server"):
        svv.run(servers=["tgi"])
