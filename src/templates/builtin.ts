/**
 * The built-in chat templates, written for this project in Jinja (the language of Hugging Face chat templates,
 * rendered by `@huggingface/jinja`). Each renders the same text format as the model family it is named after, so a
 * policy trained on one sees exactly the prompts its serving engine builds.
 *
 * Inputs, as in Hugging Face: `messages` (content already flattened to text), `tools` (OpenAI-style function
 * specs), `add_generation_prompt`, and template variables such as `bos_token` and `enable_thinking`.
 *
 * @since 0.1.0
 */

/**
 * Qwen2.5-Instruct: ChatML turns, a default system prompt, tools listed in `<tools>` inside the system turn,
 * Hermes-style `<tool_call>` JSON in assistant turns, and consecutive tool results merged into one user turn of
 * `<tool_response>` blocks.
 *
 * @category constants
 * @since 0.1.0
 */
export const qwen25 = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
{%- if has_system -%}
  {%- set system_text = messages[0].content -%}
{%- else -%}
  {%- set system_text = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." -%}
{%- endif -%}
{{- "<|im_start|>system\n" + system_text -}}
{%- if tools -%}
  {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
  {%- for tool in tools -%}
    {{- "\n" + (tool | tojson) -}}
  {%- endfor -%}
  {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" -}}
{%- endif -%}
{{- "<|im_end|>\n" -}}
{%- for message in messages -%}
  {%- if message.role == "tool" -%}
    {%- if loop.first or messages[loop.index0 - 1].role != "tool" -%}
      {{- "<|im_start|>user" -}}
    {%- endif -%}
    {{- "\n<tool_response>\n" + message.content + "\n</tool_response>" -}}
    {%- if loop.last or messages[loop.index0 + 1].role != "tool" -%}
      {{- "<|im_end|>\n" -}}
    {%- endif -%}
  {%- elif message.role == "assistant" and message.tool_calls -%}
    {{- "<|im_start|>assistant" -}}
    {%- if message.content -%}
      {{- "\n" + message.content -}}
    {%- endif -%}
    {%- for call in message.tool_calls -%}
      {%- if call.function is defined -%}
        {%- set call = call.function -%}
      {%- endif -%}
      {{- "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + (call.arguments | tojson) + "}\n</tool_call>" -}}
    {%- endfor -%}
    {{- "<|im_end|>\n" -}}
  {%- elif not (message.role == "system" and loop.first) -%}
    {{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|im_start|>assistant\n" -}}
{%- endif -%}`

/**
 * Qwen3: like Qwen2.5 without a default system prompt, plus reasoning. An assistant turn after the last real user
 * query shows its `<think>` block (the final turn always does, empty if need be); earlier turns lose theirs, which
 * is a rewrite of history that `TrajectoryBuilder` answers with a new segment. `enable_thinking=false` appends an
 * empty think block to the generation prompt. String tool arguments are written verbatim.
 *
 * @category constants
 * @since 0.1.0
 */
export const qwen3 = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
{%- if tools -%}
  {{- "<|im_start|>system\n" -}}
  {%- if has_system -%}
    {{- messages[0].content + "\n\n" -}}
  {%- endif -%}
  {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
  {%- for tool in tools -%}
    {{- "\n" + (tool | tojson) -}}
  {%- endfor -%}
  {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" -}}
{%- elif has_system -%}
  {{- "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n" -}}
{%- endif -%}
{%- set state = namespace(last_query = messages | length - 1) -%}
{%- for message in messages -%}
  {%- if message.role == "user" and not (message.content.startswith("<tool_response>") and message.content.endswith("</tool_response>")) -%}
    {%- set state.last_query = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message.role == "user" or (message.role == "system" and not loop.first) -%}
    {{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n" -}}
  {%- elif message.role == "assistant" -%}
    {%- set content = message.content -%}
    {%- set reasoning = "" -%}
    {%- if message.reasoning_content is defined and message.reasoning_content is not none -%}
      {%- set reasoning = message.reasoning_content -%}
    {%- elif "</think>" in content -%}
      {%- set reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n") -%}
      {%- set content = content.split("</think>")[-1].lstrip("\n") -%}
    {%- endif -%}
    {%- if loop.index0 > state.last_query and (loop.last or reasoning) -%}
      {{- "<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n") -}}
    {%- else -%}
      {{- "<|im_start|>assistant\n" + content -}}
    {%- endif -%}
    {%- for call in message.tool_calls or [] -%}
      {%- if not loop.first or content -%}
        {{- "\n" -}}
      {%- endif -%}
      {%- if call.function -%}
        {%- set call = call.function -%}
      {%- endif -%}
      {{- "<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " -}}
      {%- if call.arguments is string -%}
        {{- call.arguments -}}
      {%- else -%}
        {{- call.arguments | tojson -}}
      {%- endif -%}
      {{- "}\n</tool_call>" -}}
    {%- endfor -%}
    {{- "<|im_end|>\n" -}}
  {%- elif message.role == "tool" -%}
    {%- if loop.first or messages[loop.index0 - 1].role != "tool" -%}
      {{- "<|im_start|>user" -}}
    {%- endif -%}
    {{- "\n<tool_response>\n" + message.content + "\n</tool_response>" -}}
    {%- if loop.last or messages[loop.index0 + 1].role != "tool" -%}
      {{- "<|im_end|>\n" -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|im_start|>assistant\n" -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- "<think>\n\n</think>\n\n" -}}
  {%- endif -%}
{%- endif -%}`

/**
 * ChatML for small byte-level models: Qwen2.5's turn and tool-call format with no default system prompt and a
 * short tool preamble, because every character is a token for a byte-level policy.
 *
 * @category constants
 * @since 0.1.0
 */
export const chatml = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
{%- if has_system or tools -%}
  {{- "<|im_start|>system\n" -}}
  {%- if has_system -%}
    {{- messages[0].content -}}
  {%- endif -%}
  {%- if tools -%}
    {%- if has_system -%}
      {{- "\n\n" -}}
    {%- endif -%}
    {{- "# Tools\n<tools>" -}}
    {%- for tool in tools -%}
      {{- "\n" + (tool | tojson) -}}
    {%- endfor -%}
    {{- "\n</tools>\nCall a tool with <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" -}}
  {%- endif -%}
  {{- "<|im_end|>\n" -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == "tool" -%}
    {%- if loop.first or messages[loop.index0 - 1].role != "tool" -%}
      {{- "<|im_start|>user" -}}
    {%- endif -%}
    {{- "\n<tool_response>\n" + message.content + "\n</tool_response>" -}}
    {%- if loop.last or messages[loop.index0 + 1].role != "tool" -%}
      {{- "<|im_end|>\n" -}}
    {%- endif -%}
  {%- elif message.role == "assistant" and message.tool_calls -%}
    {{- "<|im_start|>assistant" -}}
    {%- if message.content -%}
      {{- "\n" + message.content -}}
    {%- endif -%}
    {%- for call in message.tool_calls -%}
      {%- if call.function is defined -%}
        {%- set call = call.function -%}
      {%- endif -%}
      {{- "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " + (call.arguments | tojson) + "}\n</tool_call>" -}}
    {%- endfor -%}
    {{- "<|im_end|>\n" -}}
  {%- elif not (message.role == "system" and loop.first) -%}
    {{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|im_start|>assistant\n" -}}
{%- endif -%}`

/**
 * Llama 3.x with JSON tool calls (the 3.1/3.2 "JSON-based tool calling" convention): header-delimited turns,
 * tools listed in the system turn, an assistant tool call written as `{"name": ..., "parameters": {...}}` (several
 * calls joined by `; `), and tool results in `ipython` turns. Unlike Meta's template, contents are not trimmed
 * and no dates are added, so rendering is deterministic and append-only.
 *
 * @category constants
 * @since 0.1.0
 */
export const llama3 = String.raw`{{- bos_token -}}
{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
{%- if has_system or tools -%}
  {{- "<|start_header_id|>system<|end_header_id|>\n\n" -}}
  {%- if tools -%}
    {{- "Environment: ipython\n\nYou have access to the following functions. To call a function, respond with JSON in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\n\n" -}}
    {%- for tool in tools -%}
      {{- (tool | tojson) + "\n\n" -}}
    {%- endfor -%}
  {%- endif -%}
  {%- if has_system -%}
    {{- messages[0].content -}}
  {%- endif -%}
  {{- "<|eot_id|>" -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == "assistant" and message.tool_calls -%}
    {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" -}}
    {%- for call in message.tool_calls -%}
      {%- if call.function is defined -%}
        {%- set call = call.function -%}
      {%- endif -%}
      {%- if not loop.first -%}
        {{- "; " -}}
      {%- endif -%}
      {{- "{\"name\": \"" + call.name + "\", \"parameters\": " + (call.arguments | tojson) + "}" -}}
    {%- endfor -%}
    {{- "<|eot_id|>" -}}
  {%- elif message.role == "tool" -%}
    {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" + message.content + "<|eot_id|>" -}}
  {%- elif not (message.role == "system" and loop.first) -%}
    {{- "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" + message.content + "<|eot_id|>" -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|start_header_id|>assistant<|end_header_id|>\n\n" -}}
{%- endif -%}`
