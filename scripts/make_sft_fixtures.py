#!/usr/bin/env python3
"""Reference fixtures for dtrain's supervised fine-tuning data, computed by TRL's SFTTrainer (the oracle).

Writes tests/fixtures/sft/:
  tokenizer.json         the byte-level BPE of tests/fixtures/tokenizer/qwen2.json (ChatML's <|im_start|>, <|im_end|>)
  tokenizer_config.json  its chat_template (ChatML, the assistant's turns inside {% generation %}, which TRL's
                         assistant_only_loss reads) and eos_token <|endoftext|>
  chat.jsonl             chats ({"messages": ...}): system, user and assistant turns, one and several of each
  completion.jsonl       prompts and completions
  packed.jsonl           prompts and completions of many lengths, for packing
  qwen3_chat.jsonl       chats for Qwen 3's template (thinking in the content, as reasoning_content, none), and
  qwen3_chat.safetensors TRL's "ids.<k>" and "labels.<k>" of each (SFTTrainer trains with TRL's training form of it)
  qwen3_prompts.json     Qwen 3's template (TRL's copy) and the prompts it renders for generation, thinking on and off
  qwen2_5_*              the same for Qwen 2.5's template (its system turn where a chat has none)
  qwen2_*, smollm2_*     the same for Qwen2-Instruct's and SmolLM2-Instruct's templates (ChatML with a system turn where
                         a chat has none; TRL has no training form of either: trained by one written here, ChatML's with
                         that turn, whose text the script checks is the template's to the byte for every chat)
  llama3_*, llama3_1_*, llama3_2_*  the same for Llama 3's, 3.1's and 3.2's (TRL's copies; 3.1's and 3.2's trained by a
                         form written here, Llama 3's training form with their system turn), with
                         llama3_tokenizer.json (tests/fixtures/tokenizer/llama3.json with Llama 3's turn markers as
                         its tokens) and rows of 128; a prompt case's "date_string" is the one it was rendered with (3.2's
                         own is today's)
  tool_suffix.json       what TRL's GRPOTrainer appends after an answer whose calls ran (tool_suffix_cases)
  qwen3_grpo_tools.json  GRPO's prompts where tools run, by Qwen 3's training form as TRL's GRPOTrainer renders them
                         (`make_sft_fixtures.py grpo_tools` writes this alone)
  packed.safetensors     packing=True (best-fit decreasing, max_length 64, TRL's padding-free collator): the weights, of
                         one batch of every packed row "loss" and "grad.<name>", and per row "ids.<k>", "labels.<k>",
                         "pos.<k>" (each example's positions from 0); "loss_unpacked": the same examples unpacked
  <name>.safetensors     for each of chat and completion: a tiny random Llama's weights (HF names), and of one batch
                         holding every example: "loss" (TRL's compute_loss: assistant_only_loss for chats, its default
                         completion_only_loss for completions), "grad.<name>" every weight's gradient, "ids.<k>" and
                         "labels.<k>" example k's tokens and labels as TRL made them (-100: not scored); metadata
                         "config"
Run with the baselines' environment (scripts/make-baselines-venv.sh, with trl):
  .venv-baselines/bin/python scripts/make_sft_fixtures.py
"""
import json
import os
import shutil
import tempfile

import torch
from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "sft")
MAX = 65  # dtrain's rows: --seq 64 inputs and targets, 65 tokens
TEMPLATE = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
            "{%- if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
            "{{ '\\n' }}{%- else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
            "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
CHATS = [
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help you today?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again, twice."},
     {"role": "assistant", "content": "Yes, yes."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue, like the sea."}],
]
# Qwen 3's template (TRL's copy of it, trl/chat_templates/qwen3.jinja; SFTTrainer trains with its training form,
# qwen3_training.jinja): answers without reasoning, with it in the content (with and without newlines around it) and
# as reasoning_content, across several turns
QWEN3_CHATS = [
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help you today?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4."}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again, twice."},
     {"role": "assistant", "content": "Yes, yes.", "reasoning_content": "\nTwice means two.\n"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "<think>the sea</think>Blue, like the sea."}],
]
# prompts for generation by the original template (add_generation_prompt), thinking on and off: an earlier answer's
# reasoning dropped, the last message an answer keeping its block
QWEN3_PROMPTS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4."}, {"role": "user", "content": "And 3 + 3?"}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "\nYes.", "reasoning_content": "Easy."}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "<think>one</think>Yes."},
     {"role": "assistant", "content": "Yes again."}, {"role": "assistant", "content": "No <think>x</think>\n\nmore."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
]
# Qwen 2.5's template (TRL's copy, trl/chat_templates/qwen2_5.jinja; SFTTrainer trains with qwen2_5_training.jinja):
# its system turn where a chat has none
QWEN25_CHATS = CHATS
QWEN25_PROMPTS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
     {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 + 3?"}],
    [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}],
]
# Tool calls (Qwen 2.5's and Qwen 3's templates write the tools in their system turn, an answer's calls as <tool_call>
# JSON and the tools' results as <tool_response> in a user turn): the tools as OpenAI's API gives them (a schema with
# a nested object, an enum, numbers, a false, control characters and text beyond ASCII: what tojson writes), a call's
# arguments an object as HF takes them
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, now.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "The city, e.g. \"Zürich\""},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "a + b\n\tof two numbers \u0001 (\u2265 0)",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number", "default": 0.5},
                                          "b": {"type": "number", "minimum": 1e-05, "maximum": 12345678.9}},
                                          "required": ["a", "b"], "additionalProperties": False}}},
]
# chats to train on with tools (one call's arguments' keys throughout: a data set's columns unify their structs), the
# tools of the first as a list, of the second as their JSON text (as data sets keep them, and TRL reads either)
ADD = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
# numbers written as floats (1.0, 0.0, 2.5e16, 1e16) in a tool's schema and a call's arguments: Python keeps them floats
# and tojson writes them back so ("1.0", "2.5e+16"), where a whole number written without a point stays an int
SCALE = [{"type": "function", "function": {"name": "scale", "description": "x times k",
                                           "parameters": {"type": "object", "properties": {
                                               "x": {"type": "number", "default": 1.0, "minimum": -2.5e16, "maximum": 1e16},
                                               "k": {"type": "integer", "default": 3, "minimum": 0.0, "maximum": 100.0}},
                                               "required": ["x"]}}}]
SCALED = {"type": "function", "function": {"name": "scale", "arguments": {"x": 2.0, "k": 3}}}
TOOL_CHATS = [
    {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": None, "tool_calls": [ADD]},
                  {"role": "tool", "content": "5"}, {"role": "assistant", "content": "It is 5."}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3, twice?"},
                  {"role": "assistant", "content": "Adding.", "tool_calls": [ADD, ADD]},
                  {"role": "tool", "content": "5"}, {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5 and 5."}],
     "tools": json.dumps(TOOLS)},
]
TOOL_PROMPTS = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "2 x 3?"}, {"role": "assistant", "content": "", "tool_calls": [SCALED]},
                  {"role": "tool", "content": "6.0"}], "tools": SCALE},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and 2 + 3?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                                  {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                  {"role": "tool", "content": "{\"temp\": 18}"}, {"role": "tool", "content": "5"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "2 + 3?"},
                  {"role": "assistant", "content": "Let me add.", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                  {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5."}, {"role": "user", "content": "Thanks."}],
     "tools": TOOLS},
]
# Qwen2-Instruct's and SmolLM2-Instruct's templates (their tokenizer_config.json's chat_template): ChatML, a system
# turn where the chat has none; trained (TRL has no training form) by ChatML's generation-marked form with that turn
CHATML_WITH_SYSTEM = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                      "{{ '<|im_start|>system\\nSYSTEM<|im_end|>\\n' }}{% endif %}"
                      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SYSTEMS = {"qwen2": "You are a helpful assistant.", "smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"}
# Llama 3.1's and 3.2's training form: TRL's Llama 3 training form with their system turn (the knowledge cut-off, the
# date, the chat's system message trimmed) and their tools (as their templates write them, the answer's call scored)
LLAMA31_TRAINING = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}{%- if tools %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n" }}
{{- system_message + "<|eot_id|>" }}
{%- if tools %}
    {%- set first_user_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}
        {%- if message.tool_calls %}
            {{- '{"name": "' + message.tool_calls[0].function.name + '", "parameters": ' }}
            {{- message.tool_calls[0].function.arguments | tojson }}{{- "}" }}
        {%- else %}{{- message['content'] | trim }}{%- endif %}
        {{- '<|eot_id|>' }}{%- endgeneration %}
    {%- elif message['role'] == 'tool' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message['content'] | tojson + "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}"""
# Llama 3.1's and 3.2's with tools (their templates write one call an answer, its content left out; a tool's result
# as an ipython turn, a text quoted by tojson; the tools in the first user message, or with tools_in_user_message
# false in the system turn)
LLAMA_TOOL_CHATS = [
    {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": None, "tool_calls": [ADD]},
                  {"role": "tool", "content": "5"}, {"role": "assistant", "content": "It is 5."}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": " 2 + 3, then? "},
                  {"role": "assistant", "content": "Adding.", "tool_calls": [ADD]}, {"role": "tool", "content": "{\"sum\": 5}"},
                  {"role": "assistant", "content": " 5. "}], "tools": json.dumps(TOOLS)},
]
LLAMA_TOOL_PROMPTS = [
    {"messages": [{"role": "user", "content": " Weather in Paris? "}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "2 x 3?"}, {"role": "assistant", "content": None, "tool_calls": [SCALED]},
                  {"role": "tool", "content": "6.0"}], "tools": SCALE},
    {"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "2 + 3?"},
                  {"role": "assistant", "content": "Let me add.", "tool_calls": [ADD]}, {"role": "tool", "content": "{\"sum\": 5}"},
                  {"role": "assistant", "content": "5."}, {"role": "user", "content": "Thanks."}], "tools": TOOLS},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}], "tools": TOOLS,
     "kwargs": {"tools_in_user_message": False}},
]
# Llama 3.1's built-in tools (chat_template_kwargs' builtin_tools): named in its system turn (code_interpreter's name
# left out), a call of one written <|python_tag|>NAME.call(ARG="VALUE"), every calling answer ending <|eom_id|>
BRAVE = {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "Menlo Park weather"}}}
LLAMA31_BUILTIN_PROMPTS = [
    {"messages": [{"role": "user", "content": "Weather in Menlo Park?"}], "kwargs": {"builtin_tools": ["brave_search", "wolfram_alpha"]}},
    {"messages": [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Search, then add."},
                  {"role": "assistant", "content": None, "tool_calls": [BRAVE]}, {"role": "tool", "content": "Sunny, 20 C"},
                  {"role": "assistant", "content": None, "tool_calls": [ADD]}, {"role": "tool", "content": "5"},
                  {"role": "assistant", "content": "Sunny; 5."}, {"role": "user", "content": "Thanks."}],
     "tools": TOOLS, "kwargs": {"builtin_tools": ["brave_search", "code_interpreter"]}},
]
# Llama's chats: short (the fixture's small vocabulary spends many tokens on 3.1's system turn), a system message with
# spaces around it (trimmed)
LLAMA_CHATS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello! "}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "user", "content": "Yes?"}, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again."},
     {"role": "assistant", "content": "Yes."}],
]
LLAMA_PROMPTS = QWEN25_PROMPTS
COMPLETIONS = [
    {"prompt": "Question: the capital of France?\nAnswer:", "completion": " Paris."},
    {"prompt": "In the beginning", "completion": " God created the heaven and the earth."},
    {"prompt": "1, 2, 3,", "completion": " 4, 5, 6"},
]


PACKED = COMPLETIONS + [
    {"prompt": "Count:", "completion": " one"},
    {"prompt": "The LORD is my shepherd;", "completion": " I shall not want. He maketh me to lie down in green pastures."},
    {"prompt": "Q: 7 * 6?\nA:", "completion": " 42"},
    {"prompt": "A long prompt that goes on and on about nothing in particular, for a while,", "completion": " and stops."},
    {"prompt": "x", "completion": " y"},
    {"prompt": "Jesus wept.", "completion": " Then said the Jews, Behold how he loved him!"},
    {"prompt": "Red, green,", "completion": " blue"},
    {"prompt": "Hello", "completion": " world, and everyone in it, and everything else besides, and more."},
]
PACK = 64  # packed rows: --seq 64 tokens, each example cut at 64


def tokenizer(folder):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"), eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = TEMPLATE
    return tok


def case(name, rows, tok, folder, out):
    torch.manual_seed(len(name))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float()
    chat = name == "chat"
    args = SFTConfig(output_dir=os.path.join(folder, "run"), max_length=MAX, assistant_only_loss=chat, packing=False,
                     per_device_train_batch_size=len(rows), report_to=[], use_cpu=True, dataset_num_proc=None)
    data = Dataset.from_list([{"messages": r} for r in rows] if chat else rows)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    examples = [trainer.train_dataset[i] for i in range(len(rows))]
    batch = trainer.data_collator(examples)
    weights = {n: p.detach().clone().contiguous() for n, p in model.state_dict().items()}
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch, num_items_in_batch=(batch["labels"][:, 1:] != -100).sum())
    loss.backward()
    tensors = dict(weights)
    tensors.update({"grad." + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()})
    tensors["loss"] = loss.detach().reshape(1)
    for k in range(len(rows)):
        n = int(batch["attention_mask"][k].sum())
        tensors[f"ids.{k}"] = batch["input_ids"][k, :n].to(torch.int32).contiguous()
        tensors[f"labels.{k}"] = batch["labels"][k, :n].to(torch.int32).contiguous()
    save_file(tensors, os.path.join(out, name + ".safetensors"), metadata={"config": json.dumps(cfg.to_dict(), sort_keys=True)})
    print(f"{name}: {len(rows)} examples, loss {loss.item():.6f}, scored {int((batch['labels'] != -100).sum())} tokens")


def fixture_tokenizer(tokenizer, template):
    """The fixtures' tokenizer (tokenizer: a path under tests/fixtures) with its special tokens, Llama 3's or ChatML's,
    and template as its chat_template."""
    llama = "llama3" in tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "..", tokenizer),
                                  **(dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>") if llama
                                     else dict(eos_token="<|endoftext|>", pad_token="<|endoftext|>")))
    tok.chat_template = template
    return tok


def sft_rows(tok, data, seq, folder, positions, **config):
    """SFTTrainer's rows of data (at most seq + 1 tokens each; config: more SFTConfig): its batch, and the tensors
    "ids.<k>" and "labels.<k>" of each row's tokens."""
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=positions)
    args = SFTConfig(output_dir=os.path.join(folder, "run"), max_length=seq + 1, packing=False, per_device_train_batch_size=len(data),
                     report_to=[], use_cpu=True, dataset_num_proc=None, **config)
    trainer = SFTTrainer(model=LlamaForCausalLM(cfg), args=args, train_dataset=Dataset.from_list(data), processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(data))])
    tensors = {}
    for k in range(len(data)):
        n = int(batch["attention_mask"][k].sum())
        tensors[f"ids.{k}"] = batch["input_ids"][k, :n].to(torch.int32).contiguous()
        tensors[f"labels.{k}"] = batch["labels"][k, :n].to(torch.int32).contiguous()
    return batch, tensors


def template_case(folder, out, name, chats, prompts, template=None, training=None, tokenizer="sft/tokenizer.json", dates=(None,), seq=MAX - 1):
    """TRL's tokens and labels for chats by a template (TRL's copy, chat_templates/<name>.jinja, unless given; SFTTrainer
    trains with its training form, or with training where TRL has none, after the script checks that it renders every
    chat as the template does): <name>_chat.jsonl, <name>_chat.safetensors ("ids.<k>", "labels.<k>"), and the template's
    generation prompts, <name>_prompts.json (the template, the tokenizer and the rows' length, seq, that the chats were
    tokenized with; each case's messages, enable_thinking, date_string where it is given, text and the ids
    apply_chat_template tokenizes it to)."""
    import trl
    if template is None:
        template = open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", name + ".jinja")).read()
    tok = fixture_tokenizer(tokenizer, template)
    if training:
        for c in chats:
            m, tools = (c["messages"], c["tools"]) if isinstance(c, dict) else (c, None)
            tools = json.loads(tools) if isinstance(tools, str) else tools
            a = tok.apply_chat_template(m, tokenize=False, date_string="26 Jul 2024", tools=tools)
            b = tok.apply_chat_template(m, tokenize=False, chat_template=training, tools=tools)
            assert a == b, f"{name}: the training form renders {b!r}, the template {a!r}"
        tok.chat_template = training
    with open(os.path.join(out, name + "_chat.jsonl"), "w") as f:
        for r in chats:
            f.write(json.dumps(r if isinstance(r, dict) else {"messages": r}) + "\n")
    # the data set as TRL reads it: the tools as their JSON text (a column of lists would unify the schemas' structs)
    rows = [{"messages": r["messages"], "tools": r["tools"] if isinstance(r["tools"], str) else json.dumps(r["tools"])}
            if isinstance(r, dict) else {"messages": r, "tools": None} for r in chats]
    torch.manual_seed(3)
    batch, tensors = sft_rows(tok, rows, seq, folder, 128, assistant_only_loss=True)
    save_file(tensors, os.path.join(out, name + "_chat.safetensors"))
    tok.chat_template = template
    cases = []
    for m in prompts:
        tools = m.get("tools") if isinstance(m, dict) else None
        extra = m.get("kwargs", {}) if isinstance(m, dict) else {}
        m = m["messages"] if isinstance(m, dict) else m
        for think in (True, False):
            for date in dates:
                kw = {"date_string": date} if date else {}
                kw.update({"tools": tools} if tools else {})
                kw.update(extra)
                ids = tok.apply_chat_template(m, tokenize=True, return_dict=True, add_generation_prompt=True, enable_thinking=think, **kw)
                cases.append(dict(messages=m, enable_thinking=think, **kw, ids=list(ids["input_ids"]),
                                  text=tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True, enable_thinking=think, **kw)))
    with open(os.path.join(out, name + "_prompts.json"), "w") as f:
        json.dump({"chat_template": template, "tokenizer": tokenizer, "seq": seq, "cases": cases}, f, indent=1)
        f.write("\n")
    lengths = [int(x) for x in batch["attention_mask"].sum(1)]
    print(f"{name}: {len(chats)} chats of {lengths} tokens (cut at {seq + 1}), scored {int((batch['labels'] != -100).sum())}; {len(cases)} prompts")


# conversational prompts and completions (TRL's prompt-completion type with lists of messages): SFTTrainer scores the
# completion by default (completion_only_loss), every token from where the prompt's generation prompt and prompt +
# completion diverge (Qwen 3's empty think block before the answer, ChatML's newline after its end of turn)
CHAT_COMPLETIONS = [
    {"prompt": [{"role": "user", "content": "Hello there"}], "completion": [{"role": "assistant", "content": "Hi! How can I help?"}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": "Again."}], "completion": [{"role": "assistant", "content": "Yes, yes."}]},
]
TOOL_COMPLETIONS = [
    {"prompt": [{"role": "user", "content": "2 + 3?"}], "completion": [{"role": "assistant", "content": None, "tool_calls": [ADD]}],
     "tools": TOOLS},
    {"prompt": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": None, "tool_calls": [ADD]},
                {"role": "tool", "content": "5"}], "completion": [{"role": "assistant", "content": "It is 5."}], "tools": json.dumps(TOOLS)},
]
# the same with each row's chat_template_kwargs (TRL's SFTTrainer and DPOTrainer pass a row's to apply_chat_template):
# Qwen 3's generation prompt with thinking off ends in an empty think block, Llama 3.1's system turn takes the date and,
# with tools_in_user_message false, the tools (a data set's rows share one set of keys: Arrow makes them one struct)
QWEN3_KWARGS = {"enable_thinking": False}
# Llama 3.1's built-in tools: a completion that calls one (its call and <|eom_id|> scored), and an answer after its result
BUILTIN_KWARGS = {"builtin_tools": ["brave_search", "wolfram_alpha"]}
BUILTIN_COMPLETIONS = [
    {"prompt": [{"role": "user", "content": "Weather in Menlo Park?"}],
     "completion": [{"role": "assistant", "content": None, "tool_calls": [BRAVE]}], "tools": TOOLS},
    {"prompt": [{"role": "user", "content": "Weather in Menlo Park?"}, {"role": "assistant", "content": None, "tool_calls": [BRAVE]},
                {"role": "tool", "content": "Sunny"}], "completion": [{"role": "assistant", "content": "Sunny."}], "tools": json.dumps(TOOLS)},
]
LLAMA31_KWARGS = {"date_string": "07 Dec 2026", "tools_in_user_message": False}


def completion_cases(folder, names):
    """TRL's rows of conversational prompts and completions by ChatML's template (the fixture's own), Qwen 3's and Llama
    3.1's (with tools): <name>_completion.jsonl, <name>_completion.safetensors ("ids.<k>", "labels.<k>")."""
    import trl
    own = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    cases = {"chatml": (TEMPLATE, "sft/tokenizer.json", CHAT_COMPLETIONS, 64),
             "qwen3": (open(os.path.join(own, "qwen3.jinja")).read(), "sft/tokenizer.json", CHAT_COMPLETIONS + TOOL_COMPLETIONS, 1023),
             "llama3_1": (open(os.path.join(own, "llama3_1.jinja")).read(), "sft/llama3_tokenizer.json",
                          CHAT_COMPLETIONS + TOOL_COMPLETIONS, 1023),
             "qwen3_kwargs": (open(os.path.join(own, "qwen3.jinja")).read(), "sft/tokenizer.json",
                              [dict(r, chat_template_kwargs=QWEN3_KWARGS) for r in CHAT_COMPLETIONS + TOOL_COMPLETIONS], 1023),
             "llama3_1_kwargs": (open(os.path.join(own, "llama3_1.jinja")).read(), "sft/llama3_tokenizer.json",
                                 [dict(r, chat_template_kwargs=LLAMA31_KWARGS) for r in CHAT_COMPLETIONS + TOOL_COMPLETIONS], 1023),
             "llama3_1_builtin": (open(os.path.join(own, "llama3_1.jinja")).read(), "sft/llama3_tokenizer.json",
                                  [dict(r, chat_template_kwargs=BUILTIN_KWARGS) for r in CHAT_COMPLETIONS + BUILTIN_COMPLETIONS], 1023)}
    for name in names or cases:
        template, tokf, rows, seq = cases[name]
        tok = fixture_tokenizer(tokf, template)
        with open(os.path.join(OUT, name + "_completion.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        data = [dict(r, tools=r["tools"] if isinstance(r.get("tools"), str) else json.dumps(r["tools"]) if r.get("tools") else None)
                for r in rows]
        batch, tensors = sft_rows(tok, data, seq, folder, 1024)
        save_file(tensors, os.path.join(OUT, name + "_completion.safetensors"))
        lengths = [int(x) for x in batch["attention_mask"].sum(1)]
        print(f"{name}_completion: {len(rows)} conversational prompts and completions of {lengths} tokens, scored "
              f"{int((batch['labels'] != -100).sum())}")


def tool_suffix_cases():
    """What TRL's GRPOTrainer appends after an answer whose calls have run (its _get_tool_suffix_ids, as text: a dummy
    answer calling the tool rendered with and without the results and the generation prompt, the first cut after its
    last end-of-text, the template's end of turn; by the training form where the template does not preserve a
    conversation's prefix, as TRL does), for Qwen 2.5's, Qwen 3's (thinking on and off) and Llama 3.1's and 3.2's
    templates, one result and two: tool_suffix.json, each case's template kind, kwargs, results and text."""
    import trl
    own = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    cases = []
    for name, kind, eos, kwargs in (("qwen2_5", "qwen2.5", "<|im_end|>", {}), ("qwen3", "qwen3", "<|im_end|>", {}),
                                    ("qwen3", "qwen3", "<|im_end|>", {"enable_thinking": False}),
                                    ("llama3_1", "llama3.1", "<|eot_id|>", {}), ("llama3_2", "llama3.2", "<|eot_id|>", {"date_string": "26 Jul 2024"})):
        from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "tokenizer.json"), eos_token=eos)
        tok.chat_template = open(os.path.join(own, name + ".jinja")).read()
        if not is_chat_template_prefix_preserving(tok):  # (Qwen 3's: TRL's GRPOTrainer takes its training form then)
            tok.chat_template = get_training_chat_template(tok)
        for results in (["5"], ["5", "{\"sum\": 5}"]):
            tool = [{"role": "tool", "name": "add", "content": r} for r in results]
            dummy = [{"role": "user", "content": "dummy"},
                     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {}}}]}]
            prefix = tok.apply_chat_template(dummy, tokenize=False, add_generation_prompt=False, **kwargs)
            full = tok.apply_chat_template(dummy + tool, tokenize=False, add_generation_prompt=True, **kwargs)
            prefix = prefix[:prefix.rindex(eos) + len(eos)]
            assert full.startswith(prefix), (name, prefix, full)
            cases.append({"kind": kind, "kwargs": kwargs, "results": tool, "text": full[len(prefix):]})
    with open(os.path.join(OUT, "tool_suffix.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"tool_suffix: {len(cases)} cases")


def grpo_tool_prompt_cases():
    """GRPO's prompts where tools run, as TRL's GRPOTrainer renders them: by the template's training form where the
    template does not keep a conversation's prefix (Qwen 3's: every earlier answer with its think block, where the
    template itself drops those before the last query), with the generation prompt (thinking on and off):
    qwen3_grpo_tools.json, each case's messages, tools, enable_thinking, text and ids ("training": true)."""
    import trl
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
    own = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(OUT, "tokenizer.json"), eos_token="<|im_end|>")
    tok.chat_template = open(os.path.join(own, "qwen3.jinja")).read()
    assert not is_chat_template_prefix_preserving(tok)
    generation, training = tok.chat_template, get_training_chat_template(tok)
    prompts = [
        [{"role": "user", "content": "2 + 3?"},
         {"role": "assistant", "content": "", "reasoning_content": "Add them.", "tool_calls": [ADD]},
         {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5.", "reasoning_content": "It is 5."},
         {"role": "user", "content": "And 3 + 4?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Yes?"},
         {"role": "assistant", "content": "<think>\nShort.\n</think>\n\nYes."}, {"role": "user", "content": "Again?"}],
    ]
    cases, differ = [], 0
    for m in prompts:
        for think in (True, False):
            kw = dict(tools=TOOLS, add_generation_prompt=True, enable_thinking=think)
            text = tok.apply_chat_template(m, tokenize=False, chat_template=training, **kw)
            differ += text != tok.apply_chat_template(m, tokenize=False, chat_template=generation, **kw)
            ids = tok.apply_chat_template(m, tokenize=True, return_dict=True, chat_template=training, **kw)["input_ids"]
            cases.append(dict(messages=m, tools=TOOLS, enable_thinking=think, training=True, text=text, ids=list(ids)))
    assert differ == len(cases), "the training form renders these prompts as the template does"
    with open(os.path.join(OUT, "qwen3_grpo_tools.json"), "w") as f:
        json.dump({"chat_template": training, "tokenizer": "sft/tokenizer.json", "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"qwen3_grpo_tools: {len(cases)} prompts by the training form")


def template_cases(folder, names):
    """The templates' fixtures (qwen3, qwen2_5, qwen2, smollm2, llama3, llama3_1, llama3_2), those named or all."""
    llama = dict(tokenizer="sft/llama3_tokenizer.json", seq=128)
    t = Tokenizer.from_file(os.path.join(OUT, "..", "tokenizer", "llama3.json"))  # with Llama 3's turn markers as its tokens
    t.add_special_tokens([AddedToken("<|start_header_id|>", special=True), AddedToken("<|end_header_id|>", special=True)])
    t.save(os.path.join(OUT, "llama3_tokenizer.json"))
    cases = {
        # (rows of 1024: room for the tools' system turn)
        "qwen3": lambda: template_case(folder, OUT, "qwen3", QWEN3_CHATS + TOOL_CHATS, QWEN3_PROMPTS + TOOL_PROMPTS, seq=1023),
        "qwen2_5": lambda: template_case(folder, OUT, "qwen2_5", QWEN25_CHATS + TOOL_CHATS, QWEN25_PROMPTS + TOOL_PROMPTS, seq=1023),
        "llama3": lambda: template_case(folder, OUT, "llama3", LLAMA_CHATS, LLAMA_PROMPTS, **llama),
        # (rows of 1024 for the chats with tools)
        "llama3_1": lambda: template_case(folder, OUT, "llama3_1", LLAMA_CHATS + LLAMA_TOOL_CHATS,
                                          LLAMA_PROMPTS + LLAMA_TOOL_PROMPTS + LLAMA31_BUILTIN_PROMPTS, training=LLAMA31_TRAINING, dates=(None, "01 Jan 2025"), **dict(llama, seq=1023)),
        # 3.2's own date is today's: every prompt names one
        "llama3_2": lambda: template_case(folder, OUT, "llama3_2", LLAMA_CHATS + LLAMA_TOOL_CHATS, LLAMA_PROMPTS + LLAMA_TOOL_PROMPTS,
                                          training=LLAMA31_TRAINING, dates=("26 Jul 2024", "01 Jan 2025"), **dict(llama, seq=1023)),
    }
    for n, system in SYSTEMS.items():
        cases[n] = (lambda n, system: lambda: template_case(
            folder, OUT, n, CHATS, QWEN25_PROMPTS, template=CHATML_WITH_SYSTEM.replace("SYSTEM", system),
            training=TEMPLATE.replace("{%- for message in messages %}", "{%- if messages[0]['role'] != 'system' %}"
                                      "{{ '<|im_start|>system\\n" + system + "<|im_end|>\\n' }}{%- endif %}"
                                      "{%- for message in messages %}", 1)))(n, system)
    for n in names or cases:
        cases[n]()
    return cases


def packed_case(tok, folder, out):
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2, tie_word_embeddings=False,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float()
    weights = {n: p.detach().clone().contiguous() for n, p in model.state_dict().items()}
    losses = {}
    for packing in (False, True):
        args = SFTConfig(output_dir=os.path.join(folder, "run"), max_length=PACK, packing=packing, per_device_train_batch_size=len(PACKED),
                         report_to=[], use_cpu=True, dataset_num_proc=None, bf16=False)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(PACKED), processing_class=tok)
        rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
        batch = trainer.data_collator(rows)
        model.zero_grad()
        labels = batch["labels"]
        loss = trainer.compute_loss(model, batch, num_items_in_batch=(labels[:, 1:] != -100).sum())
        if packing:
            loss.backward()
        losses[packing] = (loss, rows, batch)
    loss, rows, batch = losses[True]
    tensors = dict(weights)
    tensors.update({"grad." + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()})
    tensors["loss"], tensors["loss_unpacked"] = loss.detach().reshape(1), losses[False][0].detach().reshape(1)
    at = 0  # the collator flattened the rows into one sequence: cut it back
    for k, r in enumerate(rows):
        n = len(r["input_ids"])
        tensors[f"ids.{k}"] = batch["input_ids"][0, at:at + n].to(torch.int32).contiguous()
        tensors[f"labels.{k}"] = batch["labels"][0, at:at + n].to(torch.int32).contiguous()
        tensors[f"pos.{k}"] = batch["position_ids"][0, at:at + n].to(torch.int32).contiguous()
        at += n
    save_file(tensors, os.path.join(out, "packed.safetensors"), metadata={"config": json.dumps(cfg.to_dict(), sort_keys=True)})
    print(f"packed: {len(PACKED)} examples in {len(rows)} rows, loss {loss.item():.6f} (unpacked {losses[False][0].item():.6f})")


def main():
    """Every fixture, or (with template names on the command line: qwen3, qwen2_5, qwen2, smollm2, llama3, llama3_1,
    llama3_2) those templates' only."""
    import sys
    if sys.argv[1:] == ["tool_suffix"]:
        tool_suffix_cases()
        return
    if sys.argv[1:] == ["grpo_tools"]:
        grpo_tool_prompt_cases()
        return
    if sys.argv[1:2] == ["completion"]:
        with tempfile.TemporaryDirectory() as tmp:
            completion_cases(tmp, sys.argv[2:])
        return
    if sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            template_cases(tmp, sys.argv[1:])
        return
    os.makedirs(OUT, exist_ok=True)
    shutil.copy(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "qwen2.json"), os.path.join(OUT, "tokenizer.json"))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TEMPLATE, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")
    with open(os.path.join(OUT, "chat.jsonl"), "w") as f:
        for r in CHATS:
            f.write(json.dumps({"messages": r}) + "\n")
    with open(os.path.join(OUT, "completion.jsonl"), "w") as f:
        for r in COMPLETIONS:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(OUT, "packed.jsonl"), "w") as f:
        for r in PACKED:
            f.write(json.dumps(r) + "\n")
    torch.use_deterministic_algorithms(True)
    tok = tokenizer(OUT)
    with tempfile.TemporaryDirectory() as tmp:
        case("chat", CHATS, tok, tmp, OUT)
        case("completion", COMPLETIONS, tok, tmp, OUT)
        packed_case(tok, tmp, OUT)
        template_cases(tmp, None)
        completion_cases(tmp, None)
    tool_suffix_cases()
    grpo_tool_prompt_cases()


if __name__ == "__main__":
    main()
