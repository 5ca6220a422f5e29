"""Tiny deterministic byte-level BPE tokenizer for test checkpoints.

Trained with the ``tokenizers`` library on a small built-in corpus of English,
code, JSON and the tool-call markups of the supported families, so prompts,
JSON arguments and tool calls tokenize into plausible pieces instead of bytes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Markers that published checkpoints register as added tokens but NOT as
# "special" (Qwen does this so they survive skip_special_tokens decoding and
# tool/think parsers can see them).
NON_SPECIAL_MARKERS = frozenset(
    {
        "<think>", "</think>", "<tool_call>", "</tool_call>",
        "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
        "<arg_value>", "</arg_value>",
    }
)

_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A language model predicts the next
token from the previous ones. Hello! How are you today? I am fine, thank you.
What is the weather like in Paris? It is sunny and warm, about 24 degrees.
Please write a short poem about the sea. The sea is wide and blue and deep.
Can you help me with my homework? Of course, let us start with the first question.
The server streams tokens to the client as soon as they are generated.
You are a helpful assistant. Answer the question concisely and accurately.
Let me think step by step. First, we add the numbers. Then we divide by two.
The capital of France is Paris. The capital of Japan is Tokyo. The capital of
Germany is Berlin. Water boils at 100 degrees Celsius at sea level.
Once upon a time there was a small robot who wanted to learn how to paint.
Summarize the following text in one sentence. Translate this into French.
I'm sorry, but I can't help with that. Sure, here's an example for you.
"""

_CODE = '''\
def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


class Cache:
    def __init__(self, size=128):
        self.size = size
        self.items = {}

    def get(self, key, default=None):
        return self.items.get(key, default)


for i in range(10):
    print(f"value {i}: {i * i}")

import json, os, sys
with open("config.json", "r", encoding="utf-8") as f:
    config = json.load(f)

function add(a, b) { return a + b; }
const result = await fetch("/v1/chat/completions", { method: "POST" });
SELECT name, age FROM users WHERE age > 21 ORDER BY name;
$ ls -la /tmp && cat README.md | grep -n "install"
'''

_JSON = [
    {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}},
    {"name": "search", "arguments": {"query": "mlx inference server", "limit": 5}},
    {"name": "bash", "arguments": {"command": "ls -la"}},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                    "required": ["path"]}}},
    {"id": "call_0", "object": "chat.completion", "choices": [{"index": 0,
     "finish_reason": "tool_calls", "message": {"content": None}}], "usage": {
     "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}},
    {"temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stream": True, "stop": ["\n"]},
]

_MARKUP = """\
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the weather in Paris?<|im_end|>
<|im_start|>assistant
<think>
The user wants the weather. I should call the tool.
</think>

<tool_call>
{"name": "get_weather", "arguments": {"location": "Paris"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temperature": 24, "condition": "sunny"}
</tool_response><|im_end|>
<tool_call>
<function=bash>
<parameter=command>
ls -la
</parameter>
</function>
</tool_call>
<function name="get_weather"><param name="city">Tokyo</param><param name="date">2024-06-27</param></function>
<function name="write"><param name="text"><![CDATA[a < b && c]]></param></function>
[gMASK]<sop><|system|>
You are a helpful assistant.<|user|>
List the files.<|assistant|>
<think>List them.</think>
<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call><|observation|>
<bos><start_of_turn>user
Hello<end_of_turn>
<start_of_turn>model
Hi there!<end_of_turn>
<|turn>user
Hello<turn|>
<|turn>model
<|channel>thought
Thinking.<channel|><|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>
<|begin_of_text|><|start_header_id|>user<|end_header_id|>

Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>

Hi!<|eot_id|>
"""  # noqa: E501 (real chat markup, verbatim)

_WORDS = ("alpha beta gamma delta token model layer cache prompt reply server "
          "stream batch expert router weight value key query").split()


def corpus() -> list[str]:
    """The built-in training corpus; generated variations give BPE enough pairs."""
    docs = [_ENGLISH, _CODE, _MARKUP]
    docs += [json.dumps(d) for d in _JSON] + [json.dumps(d, indent=2) for d in _JSON]
    for i in range(200):
        a, b = _WORDS[i % len(_WORDS)], _WORDS[(i * 7 + 3) % len(_WORDS)]
        docs.append(
            f'{{"id": {i}, "{a}": "{b} {i * 37 % 1000}", "score": {i / 7:.3f}, '
            f'"ok": {str(i % 3 == 0).lower()}, "tags": ["{a}", "{b}"]}}\n'
            f"The {a} of the {b} is {i * 13 % 97}. {a.title()} {b}s are useful.\n"
            f"def {a}_{b}(x):\n    return x * {i} + {i % 11}\n"
        )
    # Pseudo-words from a fixed LCG: enough distinct pairs for ~2k merges.
    syl = "ka lo mi ne ru ta shi en ver con pro ing tion al er st re de un th".split()
    state, words = 12345, []
    for _ in range(6000):
        state = (state * 1103515245 + 12345) % 2**31
        n = 1 + state % 3
        words.append("".join(syl[(state >> (5 * k + 3)) % len(syl)] for k in range(n)))
    docs += [" ".join(words[i : i + 12]) + ".\n" for i in range(0, len(words), 12)]
    return docs


@functools.lru_cache(maxsize=32)
def _train(vocab_size: int, specials: tuple[str, ...]) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok.to_str()


def build_tokenizer(
    vocab_size: int,
    special_tokens: Sequence[str],
    bos_token: str | None = None,
    non_special: Iterable[str] = NON_SPECIAL_MARKERS,
) -> str:
    """Return tokenizer.json text: specials get ids 0..n-1 in the given order."""
    specials = tuple(dict.fromkeys(special_tokens))
    if vocab_size < 256 + len(specials) + 16:
        raise ValueError(f"vocab_size {vocab_size} too small for bytes + specials")
    tok = Tokenizer.from_str(_train(vocab_size, specials))
    if bos_token is not None:
        bos_id = tok.token_to_id(bos_token)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B",
            special_tokens=[(bos_token, bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    data = json.loads(tok.to_str())
    non_special = set(non_special)
    for entry in data["added_tokens"]:
        entry["normalized"] = False
        entry["special"] = entry["content"] not in non_special
    return json.dumps(data, ensure_ascii=False, indent=2, sort_keys=False)


CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '')"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
