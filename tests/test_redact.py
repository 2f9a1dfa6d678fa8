"""What counts as a secret: credentials are masked, settings that merely mention tokens are not."""

from harness.redact import redact_argv, redact_config, redact_env


def test_credentials_are_masked():
    assert redact_argv(["--api-key", "sk-1", "--hf-token=hf-2", "--headers", "Authorization=Bearer x"]) == [
        "--api-key", "***", "--hf-token=***", "--headers", "Authorization=***"]
    assert redact_env({"HF_TOKEN": "a", "OPENAI_API_KEY": "b", "DB_PASSWORD": "c", "VLLM_HOST_IP": "d"}) == {
        "HF_TOKEN": "***", "OPENAI_API_KEY": "***", "DB_PASSWORD": "***", "VLLM_HOST_IP": "d"}


def test_settings_that_mention_tokens_stay():
    argv = ["--max-tokens", "220", "--max-num-batched-tokens", "32768", "--tokenizer-path", "t",
            "--speculative-config", '{"num_speculative_tokens":3}']
    assert redact_argv(argv) == argv
    config = {"serve": {"max_num_batched_tokens": 32768}, "env": {"GITHUB_TOKEN": "g"},
              "extra_args": ["--api-key", "k"]}
    assert redact_config(config) == {"serve": {"max_num_batched_tokens": 32768}, "env": {"GITHUB_TOKEN": "***"},
                                     "extra_args": ["--api-key", "***"]}
