var __defProp = Object.defineProperty;
var __export = (target, all) => {
  for (var name2 in all)
    __defProp(target, name2, { get: all[name2], enumerable: true });
};

// prof-search.ts
import { Effect as Effect42, Layer as Layer11, Stream as Stream2 } from "effect";

// actors/ChainFormat.ts
import { Effect as Effect4 } from "effect";

// src/RolloutError.ts
import { Schema } from "effect";
var Reason = Schema.Literals([
  "SamplerTransient",
  // sampler timeout, overload, 5xx, transport: worth retrying
  "SamplerRejected",
  // the sampler refused the request (e.g. a prompt longer than its context)
  "SamplerUnusable",
  // the backend cannot serve token-in/token-out (no token ids) or was shut down
  "ParseFailed",
  // the assistant turn could not be parsed (malformed tool call)
  "ToolFailed",
  // a tool call failed in a way the model can react to
  "EnvFailed",
  // the environment crashed or a step failed
  "LeaseFailed",
  // no environment could be leased (pool closed, lease timeout)
  "RewardFailed",
  // the reward function failed
  "TemplateFailed",
  // the chat template or tokenizer failed (e.g. a history rewrite it cannot segment)
  "ChainDefect"
  // a defect in the chain, after its restarts ran out
]);
var Policy = Schema.Literals(["retry", "feedback", "zero_reward", "mask", "drop_group", "abort_run"]);
var RolloutError = class extends Schema.TaggedError()("RolloutError", {
  reason: Reason,
  message: Schema.String,
  chainId: Schema.optionalKey(Schema.String)
}) {
  get isRetryable() {
    return this.reason === "SamplerTransient" || this.reason === "LeaseFailed" || this.reason === "EnvFailed";
  }
};
var defaultPolicies = {
  SamplerTransient: "retry",
  SamplerRejected: "mask",
  SamplerUnusable: "abort_run",
  ParseFailed: "feedback",
  ToolFailed: "feedback",
  EnvFailed: "mask",
  LeaseFailed: "retry",
  RewardFailed: "zero_reward",
  TemplateFailed: "mask",
  ChainDefect: "mask"
};
var policyFor = (reason, policies) => policies?.overrides?.[reason] ?? defaultPolicies[reason];
var afterRetry = (policies) => policies?.afterRetry ?? "mask";
var canFeedBack = (reason) => reason === "ParseFailed" || reason === "ToolFailed" || reason === "EnvFailed";
var fromSamplerError = (error2, chainId) => new RolloutError({
  reason: error2.isRetryable ? "SamplerTransient" : error2.reason === "BadRequest" ? "SamplerRejected" : "SamplerUnusable",
  message: `sampler ${error2.reason}: ${error2.message}`,
  ...chainId === void 0 ? {} : { chainId }
});

// src/ToolCallParser.ts
import { Schema as Schema2 } from "effect";

// src/internal/json.ts
var parseStrict = (text4) => {
  try {
    return { value: JSON.parse(text4) };
  } catch {
    return void 0;
  }
};
var scanValueEnd = (text4, start3) => {
  let depth = 0;
  let inString = false;
  for (let i = start3; i < text4.length; i++) {
    const c = text4.charCodeAt(i);
    if (inString) {
      if (c === 92) i++;
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 123 || c === 91) depth++;
    else if (c === 125 || c === 93) {
      depth--;
      if (depth === 0) return i + 1;
      if (depth < 0) return -1;
    }
  }
  return -1;
};
var maxDepth = 256;
var Reader = class {
  pos = 0;
  text;
  constructor(text4) {
    this.text = text4;
  }
  skip() {
    const t = this.text;
    while (this.pos < t.length) {
      const c = t[this.pos];
      if (c === " " || c === "	" || c === "\n" || c === "\r") this.pos++;
      else if (c === "/" && t[this.pos + 1] === "/") {
        const end = t.indexOf("\n", this.pos);
        this.pos = end === -1 ? t.length : end;
      } else if (c === "/" && t[this.pos + 1] === "*") {
        const end = t.indexOf("*/", this.pos + 2);
        this.pos = end === -1 ? t.length : end + 2;
      } else return;
    }
  }
  value(depth) {
    if (depth > maxDepth) throw new Error("too deep");
    this.skip();
    const c = this.text[this.pos];
    if (c === void 0) throw new Error("end of input");
    if (c === "{") return this.object(depth);
    if (c === "[") return this.array(depth);
    if (c === '"' || c === "'") return this.string();
    if (c === "-" || c === "+" || c === "." || c >= "0" && c <= "9") return this.number();
    const word = this.word();
    switch (word) {
      case "true":
      case "True":
        return true;
      case "false":
      case "False":
        return false;
      case "null":
      case "None":
      case "undefined":
        return null;
      default:
        throw new Error(`unexpected ${JSON.stringify(word || c)}`);
    }
  }
  word() {
    const start3 = this.pos;
    while (this.pos < this.text.length && /[A-Za-z0-9_$]/.test(this.text[this.pos])) this.pos++;
    return this.text.slice(start3, this.pos);
  }
  number() {
    const m = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?/.exec(this.text.slice(this.pos, this.pos + 64));
    if (m === null) throw new Error("bad number");
    this.pos += m[0].length;
    return Number(m[0]);
  }
  string() {
    const quote = this.text[this.pos];
    this.pos++;
    let out = "";
    while (this.pos < this.text.length) {
      const c = this.text[this.pos];
      if (c === quote) {
        this.pos++;
        return out;
      }
      if (c === "\\") {
        const e = this.text[this.pos + 1];
        this.pos += 2;
        if (e === void 0) return out;
        if (e === "n") out += "\n";
        else if (e === "t") out += "	";
        else if (e === "r") out += "\r";
        else if (e === "b") out += "\b";
        else if (e === "f") out += "\f";
        else if (e === "u" && /^[0-9a-fA-F]{4}$/.test(this.text.slice(this.pos, this.pos + 4))) {
          out += String.fromCharCode(parseInt(this.text.slice(this.pos, this.pos + 4), 16));
          this.pos += 4;
        } else out += e;
      } else {
        out += c;
        this.pos++;
      }
    }
    return out;
  }
  key() {
    this.skip();
    const c = this.text[this.pos];
    if (c === '"' || c === "'") return this.string();
    const word = this.word();
    if (word.length === 0) throw new Error("expected a key");
    return word;
  }
  object(depth) {
    this.pos++;
    const out = {};
    for (; ; ) {
      this.skip();
      const c = this.text[this.pos];
      if (c === void 0) return out;
      if (c === "}") {
        this.pos++;
        return out;
      }
      if (c === ",") {
        this.pos++;
        continue;
      }
      const key2 = this.key();
      this.skip();
      if (this.text[this.pos] === ":" || this.text[this.pos] === "=") this.pos++;
      else throw new Error("expected ':'");
      this.skip();
      if (this.pos >= this.text.length) return out;
      const value = this.value(depth + 1);
      Object.defineProperty(out, key2, { value, enumerable: true, writable: true, configurable: true });
    }
  }
  array(depth) {
    this.pos++;
    const out = [];
    for (; ; ) {
      this.skip();
      const c = this.text[this.pos];
      if (c === void 0) return out;
      if (c === "]") {
        this.pos++;
        return out;
      }
      if (c === ",") {
        this.pos++;
        continue;
      }
      out.push(this.value(depth + 1));
    }
  }
};
var unfence = (text4) => {
  const m = /^\s*```[A-Za-z0-9_-]*\s*\n([\s\S]*?)\n?\s*```\s*$/.exec(text4);
  return m === null ? text4 : m[1];
};
var parseLenient = (text4) => {
  const strict = parseStrict(text4);
  if (strict !== void 0) return { value: strict.value, repaired: false };
  const reader = new Reader(unfence(text4));
  try {
    const value = reader.value(0);
    return { value, repaired: true };
  } catch {
    return void 0;
  }
};

// src/ToolCallParser.ts
var ParseErrorReason = Schema2.Literals([
  "InvalidJson",
  // the call body is not JSON (and could not be repaired where repair is on)
  "UnclosedTag",
  // `<tool_call>` or a code fence opened and never closed (often: output truncated)
  "UnknownShape",
  // valid JSON, but not `{ name: string, arguments: object }`; or a stray closing tag
  "AmbiguousBlocks"
  // several code blocks where exactly one is expected
]);
var ParseError = class extends Schema2.TaggedError()("ToolCallParseError", {
  reason: ParseErrorReason,
  message: Schema2.String,
  raw: Schema2.String
}) {
};
var clip = (text4) => text4.length > 200 ? `${text4.slice(0, 197)}...` : text4;
var error = (reason, message2, raw) => new ParseError({ reason, message: message2, raw: clip(raw) });
var isRecord = (u) => typeof u === "object" && u !== null && !Array.isArray(u);
var readJson = (text4, repair) => repair ? parseLenient(text4) : parseStrict(text4.trim());
var toCall = (value, id, raw) => {
  const shape = `expected {"name": <tool name>, "arguments": {...}}`;
  if (!isRecord(value)) return { error: error("UnknownShape", `tool call is not a JSON object; ${shape}`, raw) };
  const fn = isRecord(value.function) ? value.function : value;
  const name2 = fn.name;
  if (typeof name2 !== "string" || name2.trim().length === 0) {
    return { error: error("UnknownShape", `tool call has no "name"; ${shape}`, raw) };
  }
  let args = fn.arguments ?? fn.parameters ?? {};
  if (typeof args === "string") {
    const parsed = parseStrict(args);
    if (parsed === void 0 || !isRecord(parsed.value)) {
      return { error: error("InvalidJson", `arguments of ${name2} are a string that is not a JSON object`, raw) };
    }
    args = parsed.value;
  }
  if (!isRecord(args)) return { error: error("UnknownShape", `arguments of ${name2} must be a JSON object`, raw) };
  return { call: { id, type: "function", function: { name: name2.trim(), arguments: args } } };
};
var readBody = (body2, repair, nextId, calls, errors) => {
  const json = readJson(body2, repair);
  if (json === void 0) {
    errors.push(error("InvalidJson", "tool call is not valid JSON", body2));
    return;
  }
  for (const value of Array.isArray(json.value) ? json.value : [json.value]) {
    const result = toCall(value, nextId(), body2);
    if ("call" in result) calls.push(result.call);
    else errors.push(result.error);
  }
};
var idGenerator = (options) => {
  const prefix = options?.idPrefix ?? "call_";
  let i = 0;
  return () => `${prefix}${i++}`;
};
var OPEN = "<tool_call>";
var CLOSE = "</tool_call>";
var hermes = (text4, options) => {
  const repair = options?.repair ?? false;
  const nextId = idGenerator(options);
  const calls = [];
  const errors = [];
  const content = [];
  let pos = 0;
  for (; ; ) {
    const open = text4.indexOf(OPEN, pos);
    const outside = text4.slice(pos, open === -1 ? text4.length : open);
    if (outside.includes(CLOSE)) errors.push(error("UnknownShape", `${CLOSE} without a matching ${OPEN}`, outside));
    content.push(outside.split(CLOSE).join(""));
    if (open === -1) break;
    const bodyStart = open + OPEN.length;
    const close = text4.indexOf(CLOSE, bodyStart);
    const reopen = text4.indexOf(OPEN, bodyStart);
    if (close === -1 || reopen !== -1 && reopen < close) {
      const end = close === -1 ? text4.length : reopen;
      errors.push(error("UnclosedTag", `${OPEN} is never closed with ${CLOSE}`, text4.slice(open, end)));
      if (close === -1) break;
      pos = reopen;
      continue;
    }
    readBody(text4.slice(bodyStart, close), repair, nextId, calls, errors);
    pos = close + CLOSE.length;
  }
  return { content: content.join("").trim(), toolCalls: calls, errors };
};
var PYTHON_TAG = "<|python_tag|>";
var llama3 = (text4, options) => {
  const repair = options?.repair ?? false;
  const nextId = idGenerator(options);
  const trimmed = text4.trim();
  const tagged = trimmed.startsWith(PYTHON_TAG);
  const body2 = tagged ? trimmed.slice(PYTHON_TAG.length).trim() : trimmed;
  if (!body2.startsWith("{") && !body2.startsWith("[")) {
    return tagged ? { content: "", toolCalls: [], errors: [error("UnknownShape", `${PYTHON_TAG} is not followed by JSON`, body2)] } : { content: trimmed, toolCalls: [], errors: [] };
  }
  const calls = [];
  const errors = [];
  let pos = 0;
  while (pos < body2.length) {
    const end = scanValueEnd(body2, pos);
    if (end === -1) {
      readBody(body2.slice(pos), repair, nextId, calls, errors);
      break;
    }
    readBody(body2.slice(pos, end), repair, nextId, calls, errors);
    pos = end;
    while (pos < body2.length && /[\s;,]/.test(body2[pos])) pos++;
    if (pos < body2.length && body2[pos] !== "{" && body2[pos] !== "[") {
      errors.push(error("UnknownShape", "text after a JSON tool call", body2.slice(pos)));
      break;
    }
  }
  return { content: "", toolCalls: calls, errors };
};
var reactLine = /^\s*(thought|action input|action|input|observation|final answer)\s*:\s?(.*)$/i;
var react = (text4, options) => {
  const repair = options?.repair ?? true;
  const nextId = idGenerator(options);
  const lines = text4.split("\n");
  const actionAt = lines.findIndex((line) => /^\s*action\s*:/i.test(line));
  if (actionAt === -1) return { content: text4.trim(), toolCalls: [], errors: [] };
  const content = lines.slice(0, actionAt).join("\n").trim();
  const name2 = (reactLine.exec(lines[actionAt])?.[2] ?? "").trim().replace(/^[`"']+|[`"']+$/g, "");
  const inputLines = [];
  let seenInput = false;
  for (let i = actionAt + 1; i < lines.length; i++) {
    const m = reactLine.exec(lines[i]);
    const label2 = m?.[1]?.toLowerCase();
    if (!seenInput) {
      if (label2 === "action input" || label2 === "input") {
        seenInput = true;
        inputLines.push(m[2]);
      } else if (lines[i].trim().length > 0) break;
    } else if (label2 === "observation" || label2 === "thought" || label2 === "action" || label2 === "final answer") break;
    else inputLines.push(lines[i]);
  }
  const raw = lines.slice(actionAt).join("\n");
  if (name2.length === 0) {
    return { content, toolCalls: [], errors: [error("UnknownShape", "Action: names no tool", raw)] };
  }
  if (!seenInput) {
    return { content, toolCalls: [], errors: [error("UnknownShape", `Action: ${name2} has no Action Input:`, raw)] };
  }
  const input = inputLines.join("\n").trim();
  const json = input.length === 0 ? { value: {} } : readJson(input, repair);
  if (json === void 0) {
    return { content, toolCalls: [], errors: [error("InvalidJson", `Action Input of ${name2} is not JSON`, input)] };
  }
  if (!isRecord(json.value)) {
    return {
      content,
      toolCalls: [],
      errors: [error("UnknownShape", `Action Input of ${name2} must be a JSON object`, input)]
    };
  }
  const call2 = { id: nextId(), type: "function", function: { name: name2, arguments: json.value } };
  return { content, toolCalls: [call2], errors: [] };
};
var fenceLine = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
var codeBlock = (text4, options) => {
  const nextId = idGenerator(options);
  const lines = text4.split("\n");
  const blocks = [];
  for (let i = 0; i < lines.length; i++) {
    const open = fenceLine.exec(lines[i]);
    if (open === null) continue;
    const fence = open[1];
    const closing = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}\\s*$`);
    let end = -1;
    for (let j = i + 1; j < lines.length && end === -1; j++) if (closing.test(lines[j])) end = j;
    if (end === -1) {
      return {
        content: lines.slice(0, i).join("\n").trim(),
        toolCalls: [],
        errors: [error("UnclosedTag", "code block is never closed", lines.slice(i).join("\n"))]
      };
    }
    blocks.push({ start: i, end, language: open[2].toLowerCase() });
    i = end;
  }
  const accepted = options?.languages === void 0 ? blocks : blocks.filter((b) => options.languages.some((l) => l.toLowerCase() === b.language));
  if (accepted.length === 0) return { content: text4.trim(), toolCalls: [], errors: [] };
  if (accepted.length > 1) {
    return {
      content: text4.trim(),
      toolCalls: [],
      errors: [error("AmbiguousBlocks", `${accepted.length} code blocks; write exactly one`, text4)]
    };
  }
  const block = accepted[0];
  const code = lines.slice(block.start + 1, block.end).join("\n");
  const content = [...lines.slice(0, block.start), ...lines.slice(block.end + 1)].join("\n").trim();
  const call2 = {
    id: nextId(),
    type: "function",
    function: { name: options?.toolName ?? "code_interpreter", arguments: { [options?.argumentName ?? "code"]: code } }
  };
  return { content, toolCalls: [call2], errors: [] };
};
var parse = (format, text4, options) => {
  switch (format) {
    case "hermes":
      return hermes(text4, options);
    case "llama3":
      return llama3(text4, options);
    case "react":
      return react(text4, options);
    case "code":
      return codeBlock(text4, options);
  }
};
var toAssistantMessage = (result) => result.toolCalls.length > 0 ? { role: "assistant", content: result.content, tool_calls: result.toolCalls } : { role: "assistant", content: result.content };

// src/TrajectoryBuilder.ts
import { Effect as Effect3, Schema as Schema7 } from "effect";

// src/ChatTemplate.ts
import { Template } from "@huggingface/jinja";
import { Effect as Effect2, FileSystem as FileSystem2, Option as Option2, Path as Path2, Schema as Schema5 } from "effect";

// src/Message.ts
var Message_exports = {};
__export(Message_exports, {
  AssistantMessage: () => AssistantMessage,
  Content: () => Content,
  ContentPart: () => ContentPart,
  Conversation: () => Conversation,
  ImagePart: () => ImagePart,
  Message: () => Message,
  SystemMessage: () => SystemMessage,
  TextPart: () => TextPart,
  ToolCall: () => ToolCall,
  ToolMessage: () => ToolMessage,
  UserMessage: () => UserMessage,
  text: () => text
});
import { Schema as Schema3 } from "effect";
var TextPart = Schema3.Struct({ type: Schema3.Literal("text"), text: Schema3.String });
var ImagePart = Schema3.Struct({
  type: Schema3.Literal("image_url"),
  image_url: Schema3.Struct({ url: Schema3.String })
});
var ContentPart = Schema3.Union([TextPart, ImagePart]);
var Content = Schema3.Union([Schema3.String, Schema3.Array(ContentPart)]);
var ToolCall = Schema3.Struct({
  id: Schema3.String,
  type: Schema3.Literal("function"),
  function: Schema3.Struct({ name: Schema3.String, arguments: Schema3.Unknown })
});
var SystemMessage = Schema3.Struct({ role: Schema3.Literal("system"), content: Content });
var UserMessage = Schema3.Struct({ role: Schema3.Literal("user"), content: Content });
var AssistantMessage = Schema3.Struct({
  role: Schema3.Literal("assistant"),
  content: Content,
  tool_calls: Schema3.optionalKey(Schema3.Array(ToolCall)),
  reasoning_content: Schema3.optionalKey(Schema3.String)
});
var ToolMessage = Schema3.Struct({
  role: Schema3.Literal("tool"),
  content: Content,
  tool_call_id: Schema3.String,
  name: Schema3.optionalKey(Schema3.String),
  /** True when the observation reports a failed call (bad arguments, unknown tool, timeout, handler error). */
  is_error: Schema3.optionalKey(Schema3.Boolean)
});
var Message = Schema3.Union([SystemMessage, UserMessage, AssistantMessage, ToolMessage]);
var Conversation = Schema3.Array(Message);
var text = (content) => typeof content === "string" ? content : content.map((part) => part.type === "text" ? part.text : "").join("");

// src/templates/builtin.ts
var qwen25 = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
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
{%- endif -%}`;
var qwen3 = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
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
{%- endif -%}`;
var chatml = String.raw`{%- set has_system = messages | length > 0 and messages[0].role == "system" -%}
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
{%- endif -%}`;
var llama32 = String.raw`{{- bos_token -}}
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
{%- endif -%}`;

// src/templates/native.ts
var unsupported = /* @__PURE__ */ Symbol("unsupported");
var toJson = (value) => {
  switch (typeof value) {
    case "undefined":
      return "null";
    case "number":
    case "boolean":
    case "string":
      return JSON.stringify(value);
    case "object": {
      if (value === null) return "null";
      if (Array.isArray(value)) return `[${value.map(toJson).join(", ")}]`;
      return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${toJson(v)}`).join(", ")}}`;
    }
    default:
      throw unsupported;
  }
};
var text2 = (value) => {
  if (typeof value !== "string") throw unsupported;
  return value;
};
var truthy = (value) => Array.isArray(value) ? value.length > 0 : typeof value === "string" ? value.length > 0 : Boolean(value);
var toolCall = (raw) => {
  if (typeof raw !== "object" || raw === null) throw unsupported;
  const call2 = raw["function"] === void 0 ? raw : raw["function"];
  if (typeof call2 !== "object" || call2 === null) throw unsupported;
  const { arguments: args, name: name2 } = call2;
  return `
<tool_call>
{"name": "${text2(name2)}", "arguments": ${toJson(args)}}
</tool_call>`;
};
var turns = (messages, out) => {
  for (let i = 0; i < messages.length; i++) {
    const message2 = messages[i];
    const role = text2(message2["role"]);
    if (role === "tool") {
      if (i === 0 || messages[i - 1]["role"] !== "tool") out.push("<|im_start|>user");
      out.push("\n<tool_response>\n", text2(message2["content"]), "\n</tool_response>");
      if (i === messages.length - 1 || messages[i + 1]["role"] !== "tool") out.push("<|im_end|>\n");
    } else if (role === "assistant" && truthy(message2["tool_calls"])) {
      const calls = message2["tool_calls"];
      if (!Array.isArray(calls)) throw unsupported;
      out.push("<|im_start|>assistant");
      if (truthy(message2["content"])) out.push("\n", text2(message2["content"]));
      for (const call2 of calls) out.push(toolCall(call2));
      out.push("<|im_end|>\n");
    } else if (!(role === "system" && i === 0)) {
      out.push("<|im_start|>", role, "\n", text2(message2["content"]), "<|im_end|>\n");
    }
  }
};
var finish = (messages, out, addGenerationPrompt) => {
  turns(messages, out);
  if (addGenerationPrompt) out.push("<|im_start|>assistant\n");
  return out.join("");
};
var guarded = (render4) => (messages, tools, addGenerationPrompt) => {
  try {
    return render4(messages, tools, addGenerationPrompt);
  } catch (e) {
    if (e === unsupported) return void 0;
    throw e;
  }
};
var hasSystem = (messages) => messages.length > 0 && messages[0]["role"] === "system";
var toolLists = /* @__PURE__ */ new WeakMap();
var toolList = (tools) => {
  const cached = toolLists.get(tools);
  if (cached !== void 0) return cached;
  const text4 = tools.map((tool) => "\n" + toJson(tool)).join("");
  toolLists.set(tools, text4);
  return text4;
};
var qwen252 = guarded((messages, tools, addGenerationPrompt) => {
  const system = hasSystem(messages) ? text2(messages[0]["content"]) : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  const out = ["<|im_start|>system\n", system];
  if (tools !== null && tools.length > 0) {
    out.push("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" + toolList(tools) + '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>');
  }
  out.push("<|im_end|>\n");
  return finish(messages, out, addGenerationPrompt);
});
var chatml2 = guarded((messages, tools, addGenerationPrompt) => {
  const system = hasSystem(messages);
  const withTools = tools !== null && tools.length > 0;
  const out = [];
  if (system || withTools) {
    out.push("<|im_start|>system\n");
    if (system) out.push(text2(messages[0]["content"]));
    if (withTools) {
      if (system) out.push("\n\n");
      out.push(
        "# Tools\n<tools>" + toolList(tools) + '\n</tools>\nCall a tool with <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
      );
    }
    out.push("<|im_end|>\n");
  }
  return finish(messages, out, addGenerationPrompt);
});
var bySource = /* @__PURE__ */ new Map([[qwen25, qwen252], [chatml, chatml2]]);

// src/Tokenizer.ts
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Effect, FileSystem, Option, Path, Schema as Schema4 } from "effect";
var TokenizerErrorReason = Schema4.Literals([
  "NotFound",
  // tokenizer.json is missing from the model folder
  "InvalidJson",
  // a file is not JSON
  "InvalidTokenizer",
  // the JSON is not a tokenizer the runtime understands
  "InvalidTokenId"
  // an id outside the vocabulary, or not an integer
]);
var TokenizerError = class extends Schema4.TaggedError()("TokenizerError", {
  reason: TokenizerErrorReason,
  message: Schema4.String
}) {
};
var TypeId = "~agentfly/Tokenizer";
var tokenName = (value) => typeof value === "string" ? value : typeof value === "object" && value !== null && typeof value.content === "string" ? value.content : void 0;
var shortText = 64;
var cacheSize = 4096;
var escapeRegExp = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
var construct = (tokenizerJson2, config) => Option.liftThrowable(() => new HfTokenizer(tokenizerJson2, config))();
var make = Effect.fn("Tokenizer.make")(function* (tokenizerJson2, config = {}) {
  const json = tokenizerJson2;
  if (typeof json !== "object" || json === null || typeof json.model !== "object" || json.model === null) {
    return yield* new TokenizerError({ reason: "InvalidTokenizer", message: "tokenizer.json has no `model` object" });
  }
  const cfg = typeof config === "object" && config !== null ? config : {};
  const added = Array.isArray(json.added_tokens) ? json.added_tokens : [];
  for (const token of added) {
    if (typeof token?.content !== "string" || !Number.isInteger(token.id)) {
      return yield* new TokenizerError({ reason: "InvalidTokenizer", message: "an added token lacks `id`/`content`" });
    }
    if (token.lstrip === true || token.rstrip === true) {
      return yield* new TokenizerError({
        reason: "InvalidTokenizer",
        message: `added token ${JSON.stringify(token.content)} strips whitespace (lstrip/rstrip): not supported`
      });
    }
  }
  const hf = construct(tokenizerJson2, cfg);
  if (Option.isNone(hf)) {
    return yield* new TokenizerError({
      reason: "InvalidTokenizer",
      message: "@huggingface/tokenizers rejected tokenizer.json (unsupported model, normalizer or pre-tokenizer)"
    });
  }
  return fromHf(hf.value, added, cfg, isByteLevel(json, added.length));
});
var byteSymbols = (() => {
  const printable = (b) => b >= 33 && b <= 126 || b >= 161 && b <= 172 || b >= 174 && b <= 255;
  const out = [];
  let next = 256;
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : next++));
  return out;
})();
var isByteLevel = (json, addedCount) => {
  const model = json["model"];
  const pre = json["pre_tokenizer"];
  const decoder = json["decoder"];
  const vocab = model["vocab"];
  if (model["type"] !== "BPE" || !Array.isArray(model["merges"]) || model["merges"].length > 0) return false;
  if (model["byte_fallback"] === true || (json["normalizer"] ?? null) !== null) return false;
  if (pre?.["type"] !== "ByteLevel" || pre["add_prefix_space"] === true) return false;
  if (decoder?.["type"] !== "ByteLevel") return false;
  if (typeof vocab !== "object" || vocab === null) return false;
  const entries = vocab;
  return Object.keys(entries).length === 256 + addedCount && byteSymbols.every((symbol, b) => entries[symbol] === b);
};
var utf8 = new TextEncoder();
var utf8Decoder = new TextDecoder();
var pushUtf8 = (text4, out) => {
  const n = text4.length;
  for (let i = 0; i < n; i++) {
    const c = text4.charCodeAt(i);
    if (c >= 128) {
      const bytes2 = utf8.encode(i === 0 ? text4 : text4.slice(i));
      for (let k = 0; k < bytes2.length; k++) out.push(bytes2[k]);
      return;
    }
    out.push(c);
  }
};
var decodeUtf8 = (ids, start3, end) => {
  let ascii = true;
  for (let i = start3; i < end && ascii; i++) ascii = ids[i] < 128;
  if (!ascii) return utf8Decoder.decode(Uint8Array.from(ids.slice(start3, end)));
  let out = "";
  for (let i = start3; i < end; i += 4096) {
    out += String.fromCharCode.apply(null, ids.slice(i, Math.min(end, i + 4096)));
  }
  return out;
};
var fromHf = (hf, added, cfg, byteLevel2) => {
  const vocab = hf.get_vocab(true);
  let vocabSize2 = 0;
  for (const id of vocab.values()) if (id >= vocabSize2) vocabSize2 = id + 1;
  const addedTokens = new Map(added.map((t) => [t.content, t.id]));
  const splitter = added.length === 0 ? void 0 : new RegExp(`(${[...addedTokens.keys()].sort((a, b) => b.length - a.length).map(escapeRegExp).join("|")})`);
  const dense = vocab.size === vocabSize2;
  const isValidId = (id) => Number.isInteger(id) && id >= 0 && id < vocabSize2 && (dense || hf.id_to_token(id) !== void 0);
  const eosToken = tokenName(cfg.eos_token);
  const encodeOptions = { add_special_tokens: false };
  const cache = /* @__PURE__ */ new Map();
  const decodeOptions = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
  const splitAdded = (text4) => splitter === void 0 ? [text4] : text4.split(splitter).filter((piece) => piece.length > 0);
  const addedById = new Map(added.map((t) => [t.id, t.content]));
  const encodeModel = byteLevel2 ? (text4) => {
    const ids = [];
    for (const piece of splitAdded(text4)) {
      const id = addedTokens.get(piece);
      if (id !== void 0) ids.push(id);
      else pushUtf8(piece, ids);
    }
    return ids;
  } : (text4) => hf.encode(text4, encodeOptions).ids;
  const decodeModel = byteLevel2 ? (ids) => {
    let out = "";
    let start3 = 0;
    const bytes2 = (end) => end > start3 ? decodeUtf8(ids, start3, end) : "";
    for (let i = 0; i < ids.length; i++) {
      const content = addedById.get(ids[i]);
      if (content === void 0) continue;
      out += bytes2(i) + content;
      start3 = i + 1;
    }
    return out + bytes2(ids.length);
  } : (ids) => hf.decode(ids, decodeOptions);
  return {
    [TypeId]: TypeId,
    vocabSize: vocabSize2,
    addedTokens,
    eosToken,
    eosTokenId: eosToken === void 0 ? void 0 : hf.token_to_id(eosToken),
    bosToken: tokenName(cfg.bos_token),
    padToken: tokenName(cfg.pad_token),
    encode: (text4) => {
      if (text4.length === 0) return [];
      if (byteLevel2 || text4.length > shortText) return encodeModel(text4);
      const cached = cache.get(text4);
      if (cached !== void 0) return cached.slice();
      if (cache.size >= cacheSize) cache.clear();
      const ids = encodeModel(text4);
      cache.set(text4, ids);
      return ids.slice();
    },
    decode: (input) => {
      if (input.length === 0) return "";
      const ids = Array.isArray(input) ? input : Array.from(input);
      if (ids.every(isValidId)) return decodeModel(ids);
      let out = "";
      let run3 = [];
      for (const id of ids) {
        if (isValidId(id)) run3.push(id);
        else {
          if (run3.length > 0) out += decodeModel(run3);
          run3 = [];
          out += "\uFFFD";
        }
      }
      return run3.length > 0 ? out + decodeModel(run3) : out;
    },
    tokenToId: (token) => hf.token_to_id(token),
    idToToken: (id) => isValidId(id) ? hf.id_to_token(id) : void 0,
    isValidId,
    splitAdded
  };
};
var validateIds = (tokenizer, ids) => {
  const bad = ids.findIndex((id) => !tokenizer.isValidId(id));
  return bad === -1 ? Effect.void : Effect.fail(
    new TokenizerError({
      reason: "InvalidTokenId",
      message: `token id ${ids[bad]} at position ${bad} is outside the vocabulary (size ${tokenizer.vocabSize})`
    })
  );
};
var parseJson = Option.liftThrowable((text4) => JSON.parse(text4));
var readJsonFile = Effect.fn("Tokenizer.readJsonFile")(function* (file) {
  const fs = yield* FileSystem.FileSystem;
  const text4 = yield* fs.readFileString(file).pipe(
    Effect.mapError(() => new TokenizerError({ reason: "NotFound", message: `cannot read ${file}` }))
  );
  const value = parseJson(text4);
  if (Option.isNone(value)) {
    return yield* new TokenizerError({ reason: "InvalidJson", message: `${file} is not valid JSON` });
  }
  return value.value;
});
var load = Effect.fn("Tokenizer.load")(function* (modelDir) {
  const fs = yield* FileSystem.FileSystem;
  const path = yield* Path.Path;
  const tokenizerJson2 = yield* readJsonFile(path.join(modelDir, "tokenizer.json"));
  const configFile = path.join(modelDir, "tokenizer_config.json");
  const hasConfig = yield* fs.exists(configFile).pipe(Effect.orElseSucceed(() => false));
  const config = hasConfig ? yield* readJsonFile(configFile) : {};
  return yield* make(tokenizerJson2, config);
});

// src/ChatTemplate.ts
var TemplateErrorReason = Schema5.Literals([
  "NotFound",
  // the model folder has no chat template
  "InvalidSyntax",
  // the Jinja source does not parse
  "RenderFailed",
  // the template raised (e.g. `raise_exception`) or hit a runtime error on these messages
  "InvalidMessages"
  // the conversation does not decode as OpenAI-style messages
]);
var TemplateError = class extends Schema5.TaggedError()("TemplateError", {
  reason: TemplateErrorReason,
  message: Schema5.String
}) {
};
var ToolSpec = Schema5.Struct({
  type: Schema5.Literal("function"),
  function: Schema5.Struct({
    name: Schema5.String,
    description: Schema5.optionalKey(Schema5.String),
    parameters: Schema5.optionalKey(Schema5.Unknown)
  })
});
var ToolCallFormat = Schema5.Literals(["hermes", "llama3", "react", "code"]);
var TypeId2 = "~agentfly/ChatTemplate";
var templates = {
  "qwen2.5": qwen25,
  qwen3,
  llama3: llama32,
  chatml
};
var builtinDefaults = {
  "qwen2.5": { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  qwen3: { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  chatml: { toolCallFormat: "hermes", endOfTurn: "<|im_end|>", stopTokens: ["<|im_end|>", "<|endoftext|>"] },
  llama3: {
    toolCallFormat: "llama3",
    endOfTurn: "<|eot_id|>",
    stopTokens: ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
    variables: { bos_token: "<|begin_of_text|>" }
  }
};
var knownEndOfTurn = ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>"];
var inferFormat = (source) => source.includes("<tool_call>") ? "hermes" : source.includes("ipython") || source.includes("<|python_tag|>") ? "llama3" : "hermes";
var compile = Option2.liftThrowable((source) => new Template(source));
var toTemplateMessage = (message2) => {
  const content = text(message2.content);
  switch (message2.role) {
    case "assistant":
      return {
        role: "assistant",
        content,
        ...message2.tool_calls !== void 0 && message2.tool_calls.length > 0 ? { tool_calls: message2.tool_calls } : {},
        ...message2.reasoning_content !== void 0 ? { reasoning_content: message2.reasoning_content } : {}
      };
    case "tool":
      return {
        role: "tool",
        content,
        tool_call_id: message2.tool_call_id,
        ...message2.name !== void 0 ? { name: message2.name } : {}
      };
    default:
      return { role: message2.role, content };
  }
};
var make2 = (options) => {
  const compiled = compile(options.source);
  if (Option2.isNone(compiled)) {
    return Effect2.fail(new TemplateError({ reason: "InvalidSyntax", message: "the chat template does not parse" }));
  }
  const template = compiled.value;
  const endOfTurn = options.endOfTurn ?? knownEndOfTurn.find((t) => options.source.includes(t)) ?? "<|im_end|>";
  const variables = { bos_token: "", eos_token: endOfTurn, ...options.variables };
  const name2 = options.name ?? "custom";
  const nativeRender = bySource.get(options.source);
  return Effect2.succeed({
    [TypeId2]: TypeId2,
    name: name2,
    source: options.source,
    toolCallFormat: options.toolCallFormat ?? inferFormat(options.source),
    endOfTurn,
    stopTokens: options.stopTokens ?? [endOfTurn],
    variables,
    render: (messages, renderOptions = {}) => {
      const templateMessages = messages.map(toTemplateMessage);
      const tools = renderOptions.tools && renderOptions.tools.length > 0 ? renderOptions.tools : null;
      const addGenerationPrompt = renderOptions.addGenerationPrompt ?? false;
      const fast = nativeRender?.(templateMessages, tools, addGenerationPrompt);
      if (fast !== void 0) return Effect2.succeed(fast);
      return Effect2.try({
        try: () => template.render({
          ...variables,
          ...renderOptions.variables,
          messages: templateMessages,
          tools,
          add_generation_prompt: addGenerationPrompt
        }),
        catch: (cause) => new TemplateError({
          reason: "RenderFailed",
          message: `template ${name2}: ${cause instanceof Error ? cause.message : String(cause)}`
        })
      });
    }
  });
};
var builtinTemplate = (name2) => Effect2.runSync(make2({ name: name2, source: templates[name2], ...builtinDefaults[name2] }));
var load2 = Effect2.fn("ChatTemplate.load")(function* (modelDir) {
  const fs = yield* FileSystem2.FileSystem;
  const path = yield* Path2.Path;
  const configFile = path.join(modelDir, "tokenizer_config.json");
  const hasConfig = yield* fs.exists(configFile).pipe(Effect2.orElseSucceed(() => false));
  const config = hasConfig ? yield* readJsonFile(configFile).pipe(
    Effect2.mapError((e) => new TemplateError({ reason: "NotFound", message: e.message }))
  ) : {};
  const jinjaFile = path.join(modelDir, "chat_template.jinja");
  const hasJinja = yield* fs.exists(jinjaFile).pipe(Effect2.orElseSucceed(() => false));
  const source = hasJinja ? yield* fs.readFileString(jinjaFile).pipe(
    Effect2.mapError(() => new TemplateError({ reason: "NotFound", message: `cannot read ${jinjaFile}` }))
  ) : pickTemplate(config.chat_template);
  if (source === void 0) {
    return yield* new TemplateError({
      reason: "NotFound",
      message: `${modelDir} has no chat_template.jinja and no chat_template in tokenizer_config.json`
    });
  }
  const token = (value) => typeof value === "string" ? value : value?.content ?? void 0;
  const bos = token(config.bos_token);
  const eos = token(config.eos_token);
  const endOfTurn = knownEndOfTurn.find((t) => source.includes(t)) ?? eos ?? "<|im_end|>";
  const stopTokens = eos !== void 0 && eos !== endOfTurn ? [endOfTurn, eos] : [endOfTurn];
  return yield* make2({
    name: path.basename(modelDir),
    source,
    endOfTurn,
    stopTokens,
    variables: { bos_token: bos ?? "", eos_token: eos ?? endOfTurn }
  });
});
var pickTemplate = (value) => {
  if (typeof value === "string") return value;
  if (Array.isArray(value)) {
    const named = value;
    const chosen = named.find((t) => t.name === "default") ?? named[0];
    return typeof chosen?.template === "string" ? chosen.template : void 0;
  }
  return void 0;
};
var ConversationFile = Schema5.Struct({
  messages: Conversation,
  tools: Schema5.optionalKey(Schema5.Array(ToolSpec))
});

// src/Trajectory.ts
import { Schema as Schema6 } from "effect";
var Source = Schema6.Literals(["prompt", "policy", "tool", "env", "template"]);
var Span = Schema6.Struct({
  source: Source,
  tokenIds: Schema6.Array(Schema6.Int),
  logprobs: Schema6.optionalKey(Schema6.Array(Schema6.Number)),
  policyVersion: Schema6.optionalKey(Schema6.Int)
});
var Segment = Schema6.Struct({
  spans: Schema6.Array(Span),
  messageCount: Schema6.Int
});
var Termination = Schema6.Literals([
  "answer",
  // a terminal tool (e.g. `answer`) ran
  "no_tool_call",
  // the assistant replied without calling a tool
  "max_turns",
  "context_length",
  // the token budget of the context ran out
  "stop",
  // the sampler stopped on max tokens / a stop token without a parseable turn end
  "error",
  // an error whose policy ends the chain
  "episode_end",
  // the environment ended the episode (`episodeEnd` says why: solved, failed, ...)
  "interrupted"
]);
var RewardStatus = Schema6.Literals(["scored", "not_applicable", "failed", "pending"]);
var Trajectory = Schema6.Struct({
  trajectoryId: Schema6.String,
  groupId: Schema6.String,
  chainId: Schema6.String,
  messages: Schema6.Array(Message),
  segments: Schema6.Array(Segment),
  termination: Termination,
  reward: Schema6.Number,
  rewardStatus: RewardStatus,
  metrics: Schema6.Record(Schema6.String, Schema6.Number),
  trainable: Schema6.Boolean,
  masked: Schema6.Boolean,
  /** The dataset row's extra fields, passed through to rewards. */
  row: Schema6.optionalKey(Schema6.Record(Schema6.String, Schema6.Unknown)),
  /** A short description of the error that ended the chain, when `termination === "error"`. */
  error: Schema6.optionalKey(Schema6.String),
  /** The `RolloutError` reason behind `error` (`EnvFailed`, `RewardFailed`, ...), for per-reason counts. */
  errorReason: Schema6.optionalKey(Schema6.String),
  /** Why the environment ended the episode, when `termination === "episode_end"`. */
  episodeEnd: Schema6.optionalKey(Schema6.String)
});
var Group = Schema6.Struct({
  groupId: Schema6.String,
  rowIndex: Schema6.Int,
  trajectories: Schema6.Array(Trajectory)
});
var segmentLength = (segment) => segment.spans.reduce((n, span) => n + span.tokenIds.length, 0);
var clipSegment = (segment, maxTokens) => {
  if (segmentLength(segment) <= maxTokens) return segment;
  const spans = [];
  let left = maxTokens;
  for (const span of segment.spans) {
    if (left <= 0) break;
    if (span.tokenIds.length <= left) spans.push(span);
    else {
      spans.push({
        ...span,
        tokenIds: span.tokenIds.slice(0, left),
        ...span.logprobs === void 0 ? {} : { logprobs: span.logprobs.slice(0, left) }
      });
    }
    left -= span.tokenIds.length;
  }
  return { ...segment, spans };
};
var finalResponse = (trajectory) => {
  for (let i = trajectory.messages.length - 1; i >= 0; i--) {
    const message2 = trajectory.messages[i];
    if (message2.role === "assistant" || message2.role === "tool") {
      return text(message2.content);
    }
  }
  return "";
};

// src/TrajectoryBuilder.ts
var BuilderErrorReason = Schema7.Literals([
  "InvalidTokenIds",
  // sampled ids outside the vocabulary
  "LogprobsMismatch",
  // logprobs given, but not one per sampled id
  "OutOfOrder",
  // a sample right after a sample, or an assistant message passed as an observation
  "TemplateFailed"
  // the chat template could not render the conversation
]);
var BuilderError = class extends Schema7.TaggedError()("TrajectoryBuilderError", {
  reason: BuilderErrorReason,
  message: Schema7.String
}) {
};
var TypeId3 = "~agentfly/TrajectoryBuilder";
var tokenizeWithSources = (tokenizer, text4, regions, fallback) => {
  const spans = [];
  let offset = 0;
  let r = 0;
  for (const piece of tokenizer.splitAdded(text4)) {
    const end = offset + piece.length;
    while (r < regions.length && regions[r].end <= offset) r++;
    const region = regions[r];
    const source = region !== void 0 && region.start < end && region.end > offset ? region.source : fallback;
    const added = tokenizer.addedTokens.get(piece);
    const ids = added === void 0 ? tokenizer.encode(piece) : [added];
    const last = spans[spans.length - 1];
    if (last !== void 0 && last.source === source) for (const id of ids) last.tokenIds.push(id);
    else spans.push({ source, tokenIds: ids });
    offset = end;
  }
  return spans.filter((span) => span.tokenIds.length > 0);
};
var observationRegions = (suffix, observations2) => {
  const regions = [];
  let cursor = 0;
  for (const message2 of observations2) {
    const content = text(message2.content);
    if (content.length === 0) continue;
    const at2 = suffix.indexOf(content, cursor);
    if (at2 === -1) continue;
    regions.push({ start: at2, end: at2 + content.length, source: message2.role === "tool" ? "tool" : "env" });
    cursor = at2 + content.length;
  }
  return regions;
};
var trailingRegions = (text4, observations2) => {
  const regions = [];
  let cursor = text4.length;
  for (let i = observations2.length - 1; i >= 0; i--) {
    const message2 = observations2[i];
    const content = text(message2.content);
    if (content.length === 0 || cursor - content.length < 0) continue;
    const at2 = text4.lastIndexOf(content, cursor - content.length);
    if (at2 === -1) continue;
    regions.unshift({ start: at2, end: at2 + content.length, source: message2.role === "tool" ? "tool" : "env" });
    cursor = at2;
  }
  return regions;
};
var templateFailed = (error2) => new BuilderError({ reason: "TemplateFailed", message: error2.message });
var render = (builder, messages, addGenerationPrompt) => builder.template.render(messages, { tools: builder.tools, addGenerationPrompt, variables: builder.variables }).pipe(
  Effect3.mapError(templateFailed)
);
var startsWithText = (text4, prefix, position = 0) => text4.length >= position + prefix.length && text4.slice(position, position + prefix.length) === prefix;
var divergence = (a, b) => {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
};
var withOpenSegment = (builder, update) => [...builder.segments.slice(0, -1), update(builder.segments.at(-1))];
var stopIdCache = /* @__PURE__ */ new WeakMap();
var stopIds = (builder) => {
  const byTokenizer = stopIdCache.get(builder.template) ?? /* @__PURE__ */ new WeakMap();
  stopIdCache.set(builder.template, byTokenizer);
  const cached = byTokenizer.get(builder.tokenizer);
  if (cached !== void 0) return cached;
  const ids = computeStopIds(builder);
  byTokenizer.set(builder.tokenizer, ids);
  return ids;
};
var computeStopIds = (builder) => new Set(
  builder.template.stopTokens.flatMap((token) => {
    const id = builder.tokenizer.tokenToId(token);
    return id === void 0 ? [] : [id];
  })
);
var start = Effect3.fnUntraced(function* (options) {
  const tools = options.tools ?? [];
  const variables = options.variables ?? {};
  const context = { template: options.template, tools, variables };
  const rendered = yield* render(context, options.messages, true);
  const spans = tokenizeWithSources(options.tokenizer, rendered, [], "prompt");
  const builder = {
    [TypeId3]: TypeId3,
    tokenizer: options.tokenizer,
    template: options.template,
    tools,
    variables,
    messages: options.messages,
    renderMessages: options.messages,
    segments: [{ spans, messageCount: options.messages.length }],
    rewrites: [],
    awaitingObservation: false,
    rendered,
    pending: "",
    promptOf: options.messages
  };
  return builder;
});
var appendSampled = Effect3.fnUntraced(function* (builder, sample) {
  if (builder.awaitingObservation) {
    return yield* new BuilderError({
      reason: "OutOfOrder",
      message: "two samples in a row: append the observations (or finish) before sampling again"
    });
  }
  yield* validateIds(builder.tokenizer, sample.tokenIds).pipe(
    Effect3.mapError((e) => new BuilderError({ reason: "InvalidTokenIds", message: e.message }))
  );
  if (sample.logprobs !== void 0 && sample.logprobs.length !== sample.tokenIds.length) {
    return yield* new BuilderError({
      reason: "LogprobsMismatch",
      message: `${sample.logprobs.length} logprobs for ${sample.tokenIds.length} sampled ids`
    });
  }
  const ids = sample.tokenIds;
  const endsWithStop = ids.length > 0 && stopIds(builder).has(ids[ids.length - 1]);
  const body2 = builder.tokenizer.decode(endsWithStop ? ids.slice(0, -1) : ids);
  const text4 = endsWithStop ? body2 + builder.tokenizer.decode(ids.slice(-1)) : body2;
  const span = {
    source: "policy",
    tokenIds: [...ids],
    ...sample.logprobs !== void 0 ? { logprobs: [...sample.logprobs] } : {},
    ...sample.policyVersion !== void 0 ? { policyVersion: sample.policyVersion } : {}
  };
  const message2 = sample.message ?? { role: "assistant", content: body2 };
  const messages = [...builder.messages, message2];
  const result = {
    ...builder,
    messages,
    renderMessages: [...builder.renderMessages, { role: "assistant", content: body2 }],
    segments: withOpenSegment(builder, (segment) => ({
      spans: ids.length === 0 ? segment.spans : [...segment.spans, span],
      messageCount: messages.length
    })),
    awaitingObservation: true,
    pending: text4
  };
  return result;
});
var appendObservations = Effect3.fnUntraced(function* (current, observations2) {
  let builder = current;
  if (observations2.some((m) => m.role === "assistant")) {
    return yield* new BuilderError({
      reason: "OutOfOrder",
      message: "an assistant message is not an observation: append what the policy sampled with appendSampled"
    });
  }
  const renderMessages = [...builder.renderMessages, ...observations2];
  const messages = [...builder.messages, ...observations2];
  const next = yield* render(builder, renderMessages, true);
  if (!builder.awaitingObservation && !startsWithText(next, builder.rendered)) {
    const retracted = yield* retractGenerationPrompt(builder, next);
    if (retracted !== void 0) builder = retracted;
  }
  if (startsWithText(next, builder.rendered) && startsWithText(next, builder.pending, builder.rendered.length)) {
    const suffix = next.slice(builder.rendered.length + builder.pending.length);
    const spans2 = tokenizeWithSources(builder.tokenizer, suffix, observationRegions(suffix, observations2), "template");
    const result2 = {
      ...builder,
      messages,
      renderMessages,
      segments: withOpenSegment(builder, (segment) => ({
        spans: [...segment.spans, ...spans2],
        messageCount: messages.length
      })),
      awaitingObservation: false,
      rendered: next,
      pending: "",
      promptOf: renderMessages
    };
    return result2;
  }
  const closed = yield* closeSegment(builder);
  const expected = builder.rendered + builder.pending;
  const at2 = divergence(expected, next);
  const observed = trailingRegions(next, observations2);
  const firstObservation = observed[0]?.start ?? next.length;
  const lastTurnEnd = next.lastIndexOf(builder.template.endOfTurn, firstObservation - 1);
  const historyEnd = lastTurnEnd === -1 ? firstObservation : lastTurnEnd + builder.template.endOfTurn.length;
  const regions = [{ start: 0, end: historyEnd, source: "prompt" }, ...observed];
  const spans = tokenizeWithSources(builder.tokenizer, next, regions, "template");
  const rewrite = {
    atMessage: builder.messages.length,
    newSegment: closed.length,
    offset: at2,
    expected: expected.slice(at2, at2 + 80),
    actual: next.slice(at2, at2 + 80)
  };
  yield* Effect3.logDebug("TrajectoryBuilder: the chat template rewrote history; starting a new segment").pipe(
    Effect3.annotateLogs({ template: builder.template.name, atMessage: rewrite.atMessage, offset: at2 })
  );
  const result = {
    ...builder,
    messages,
    renderMessages,
    segments: [...closed, { spans, messageCount: messages.length }],
    rewrites: [...builder.rewrites, rewrite],
    awaitingObservation: false,
    rendered: next,
    pending: "",
    promptOf: renderMessages
  };
  return result;
});
var retractGenerationPrompt = Effect3.fnUntraced(function* (builder, next) {
  const probe = [{ role: "user", content: "x" }];
  const withPrompt = yield* render(builder, probe, true);
  const without = yield* render(builder, probe, false);
  const generationPrompt = startsWithText(withPrompt, without) ? withPrompt.slice(without.length) : "";
  if (generationPrompt.length === 0 || !builder.rendered.endsWith(generationPrompt)) return void 0;
  const base = builder.rendered.slice(0, -generationPrompt.length);
  if (!startsWithText(next, base)) return void 0;
  const ids = tokenizeWithSources(builder.tokenizer, generationPrompt, [], "template").flatMap((s) => s.tokenIds);
  const open = promptTokenIds(builder);
  if (open.length < ids.length || ids.some((id, i) => open[open.length - ids.length + i] !== id)) return void 0;
  const result = {
    ...builder,
    rendered: base,
    promptOf: void 0,
    segments: withOpenSegment(builder, (s) => clipSegment(s, segmentLength(s) - ids.length))
  };
  return result;
});
var closeSegment = Effect3.fnUntraced(function* (builder) {
  if (!builder.awaitingObservation) return builder.segments;
  const expected = builder.rendered + builder.pending;
  const full = yield* render(builder, builder.renderMessages, false);
  if (!startsWithText(full, expected) || full.length === expected.length) return builder.segments;
  const spans = tokenizeWithSources(builder.tokenizer, full.slice(expected.length), [], "template");
  return withOpenSegment(builder, (segment) => ({ ...segment, spans: [...segment.spans, ...spans] }));
});
var finish2 = Effect3.fnUntraced(function* (builder) {
  const segments = yield* closeSegment(builder);
  const result = {
    ...builder,
    segments,
    awaitingObservation: false,
    rendered: builder.rendered + builder.pending,
    pending: "",
    promptOf: void 0
  };
  return result;
});
var assistantTurnText = Effect3.fnUntraced(function* (builder, message2) {
  const prompt = builder.promptOf === builder.renderMessages && !builder.awaitingObservation ? builder.rendered : yield* render(builder, builder.renderMessages, true);
  const full = yield* render(builder, [...builder.renderMessages, message2], false);
  if (!startsWithText(full, prompt)) {
    return yield* new BuilderError({
      reason: "TemplateFailed",
      message: "the template renders the next assistant turn over a different history (not append-only)"
    });
  }
  const turn = full.slice(prompt.length);
  const end = turn.indexOf(builder.template.endOfTurn);
  return end === -1 ? turn : turn.slice(0, end + builder.template.endOfTurn.length);
});
var appendAssistant = Effect3.fnUntraced(function* (builder, message2, options = {}) {
  const text4 = yield* assistantTurnText(builder, message2);
  return yield* appendSampled(builder, {
    tokenIds: builder.tokenizer.encode(text4),
    message: message2,
    policyVersion: options.policyVersion
  });
});
var fromConversation = Effect3.fnUntraced(function* (options) {
  const first = options.messages.findIndex((m) => m.role === "assistant");
  const promptEnd = first === -1 ? options.messages.length : first;
  let builder = yield* start({ ...options, messages: options.messages.slice(0, promptEnd) });
  let observations2 = [];
  for (const message2 of options.messages.slice(promptEnd)) {
    if (message2.role !== "assistant") {
      observations2.push(message2);
      continue;
    }
    if (observations2.length > 0) builder = yield* appendObservations(builder, observations2);
    observations2 = [];
    builder = yield* appendAssistant(builder, message2);
  }
  if (observations2.length > 0) builder = yield* appendObservations(builder, observations2);
  return yield* finish2(builder);
});
var promptTokenIds = (builder) => builder.segments.at(-1).spans.flatMap((span) => span.tokenIds);

// actors/ChainFormat.ts
var templateFailed2 = (error2) => new RolloutError({ reason: "TemplateFailed", message: error2.message });
var fromTemplate = (options) => {
  const { template, tokenizer } = options;
  const stopTokenIds = template.stopTokens.flatMap((token) => {
    const id = tokenizer.tokenToId(token);
    return id === void 0 ? [] : [id];
  });
  const stops = new Set(stopTokenIds);
  const parseFormat = options.toolCallFormat ?? template.toolCallFormat;
  return {
    stopTokenIds,
    start: (messages, tools) => Effect4.gen(function* () {
      let builder = yield* start({
        tokenizer,
        template,
        messages,
        tools,
        ...options.variables === void 0 ? {} : { variables: options.variables }
      }).pipe(Effect4.mapError(templateFailed2));
      let turns2 = 0;
      const transcript = {
        length: () => builder.segments.at(-1).spans.reduce((n, span) => n + span.tokenIds.length, 0),
        promptTokenIds: () => promptTokenIds(builder),
        appendSampled: (result) => Effect4.gen(function* () {
          const ids = result.tokenIds;
          const complete = ids.length > 0 && stops.has(ids[ids.length - 1]);
          const text4 = tokenizer.decode(complete ? ids.slice(0, -1) : ids);
          const parsed = parse(parseFormat, text4, { idPrefix: `call_${turns2}_` });
          const message2 = toAssistantMessage(parsed);
          builder = yield* appendSampled(builder, {
            tokenIds: ids,
            logprobs: result.logprobs,
            policyVersion: result.policyVersion,
            message: message2
          }).pipe(Effect4.mapError(templateFailed2));
          turns2++;
          return {
            message: message2,
            toolCalls: parsed.toolCalls,
            parseErrors: parsed.errors.map((e) => e.message),
            complete
          };
        }),
        appendAssistant: (message2) => Effect4.gen(function* () {
          builder = yield* appendAssistant(builder, message2).pipe(Effect4.mapError(templateFailed2));
          turns2++;
          return { message: message2, toolCalls: message2.tool_calls ?? [], parseErrors: [], complete: true };
        }),
        appendObservations: (observations2) => Effect4.map(
          Effect4.mapError(appendObservations(builder, observations2), templateFailed2),
          (next) => {
            builder = next;
          }
        ),
        messages: () => builder.messages,
        segments: () => builder.segments
      };
      return transcript;
    })
  };
};

// actors/Oracle.ts
import { Effect as Effect6, Layer as Layer2 } from "effect";

// src/Sampler.ts
import { Context, Effect as Effect5, Layer, Schema as Schema8 } from "effect";
import { dual } from "effect/Function";
var SamplingParams = Schema8.Struct({
  temperature: Schema8.Number,
  topP: Schema8.optionalKey(Schema8.Number),
  topK: Schema8.optionalKey(Schema8.Int),
  maxTokens: Schema8.Int,
  stopTokenIds: Schema8.optionalKey(Schema8.Array(Schema8.Int)),
  seed: Schema8.optionalKey(Schema8.Int)
});
var GenerateRequest = Schema8.Struct({
  promptTokenIds: Schema8.Array(Schema8.Int),
  sampling: SamplingParams
});
var FinishReason = Schema8.Literals(["stop", "length"]);
var GenerateResult = Schema8.Struct({
  tokenIds: Schema8.Array(Schema8.Int),
  logprobs: Schema8.Array(Schema8.Number),
  finishReason: FinishReason,
  policyVersion: Schema8.Int
});
var SamplerErrorReason = Schema8.Literals([
  "Timeout",
  // the backend did not answer in time
  "Overloaded",
  // 429 or a full queue: retry later
  "ServerError",
  // 5xx
  "BadRequest",
  // the request itself is invalid (e.g. prompt longer than the context)
  "NoTokenIds",
  // the backend cannot return token ids: unusable for token-in/token-out training
  "Transport",
  // connection refused / reset
  "Closed"
  // the sampler was shut down
]);
var SamplerError = class extends Schema8.TaggedError()("SamplerError", {
  reason: SamplerErrorReason,
  message: Schema8.String,
  /** How long the backend asked us to wait before retrying (an HTTP `Retry-After`), when it said. */
  retryAfterMs: Schema8.optionalKey(Schema8.Number)
}) {
  get isRetryable() {
    return this.reason === "Timeout" || this.reason === "Overloaded" || this.reason === "ServerError" || this.reason === "Transport";
  }
};
var Sampler = class extends Context.Service()("agentfly/src/Sampler") {
};
var SamplerEngine = class extends Context.Service()("agentfly/src/SamplerEngine") {
};
var scriptedLogprob = (tokenId, position) => {
  const h = Math.imul(tokenId ^ 2654435769, 2246822507) ^ Math.imul(position + 1, 3266489909);
  return -((h >>> 0) % 1e3 + 1) / 1e3;
};
var shapeCompletion = (request, completion, policyVersion) => {
  const full = "tokenIds" in completion ? completion.tokenIds : completion;
  const given = "tokenIds" in completion ? completion : void 0;
  const stops = request.sampling.stopTokenIds;
  let end = full.length;
  let finishReason = given?.finishReason ?? "stop";
  if (stops !== void 0 && stops.length > 0) {
    const at2 = full.findIndex((id) => stops.includes(id));
    if (at2 >= 0) {
      end = at2 + 1;
      finishReason = "stop";
    }
  }
  if (end > request.sampling.maxTokens) {
    end = Math.max(0, request.sampling.maxTokens);
    finishReason = "length";
  }
  const tokenIds2 = full.slice(0, end);
  const logprobs2 = given?.logprobs !== void 0 ? given.logprobs.slice(0, end) : tokenIds2.map((id, i) => scriptedLogprob(id, i));
  return { tokenIds: tokenIds2, logprobs: logprobs2, finishReason, policyVersion };
};
var makeScripted = (script2, options) => Effect5.sync(() => {
  let calls = 0;
  const version = options?.policyVersion;
  const policyVersion = version === void 0 ? Effect5.succeed(0) : typeof version === "number" ? Effect5.succeed(version) : version;
  const next = (request) => {
    const call2 = calls++;
    if (typeof script2 === "function") {
      const out = script2(request, call2);
      return Effect5.isEffect(out) ? out : Effect5.succeed(out);
    }
    const completion = script2[call2];
    return completion === void 0 ? Effect5.fail(
      new SamplerError({ reason: "BadRequest", message: `scripted sampler exhausted after ${script2.length} calls` })
    ) : Effect5.succeed(completion);
  };
  return Sampler.of({
    generate: Effect5.fnUntraced(function* (request) {
      const completion = yield* next(request);
      if (completion instanceof SamplerError) return yield* completion;
      return shapeCompletion(request, completion, yield* policyVersion);
    }),
    policyVersion
  });
});
var withScriptedSampler = dual(
  (args) => Effect5.isEffect(args[0]),
  (self, script2, options) => Effect5.flatMap(makeScripted(script2, options), (sampler2) => Effect5.provideService(self, Sampler, sampler2))
);
var ChatRequest = Schema8.Struct({
  messages: Conversation,
  tools: Schema8.optionalKey(Schema8.Array(Schema8.Unknown)),
  sampling: SamplingParams
});
var ChatResult = Schema8.Struct({
  content: Schema8.String,
  toolCalls: Schema8.Array(ToolCall),
  finishReason: FinishReason
});
var ChatSampler = class extends Context.Service()("agentfly/src/ChatSampler") {
};

// actors/Oracle.ts
var call = (messages, name2, args) => ({
  id: `call_${messages.filter((m) => m.role === "assistant").length}`,
  type: "function",
  function: { name: name2, arguments: args }
});
var sampler = (policy) => ChatSampler.of({
  complete: (request) => Effect6.map(Effect6.suspend(() => lift(policy(request.messages))), (reply) => ({
    content: reply.content ?? "",
    toolCalls: reply.toolCalls ?? [],
    finishReason: "stop"
  }))
});
var lift = (reply) => Effect6.isEffect(reply) ? reply : Effect6.succeed(reply);
var layer = (policy) => Layer2.succeed(ChatSampler, sampler(policy));
var text3 = (message2) => message2 === void 0 ? "" : text(message2.content);

// actors/Rollout.ts
import { Cause as Cause4, Effect as Effect32, FiberSet, Queue, Random, Result as Result4, Schedule as Schedule4, Schema as Schema31, Semaphore as Semaphore4, Stream } from "effect";

// src/Environment.ts
import { Context as Context2, Effect as Effect7, Layer as Layer3, RcMap, Schema as Schema9 } from "effect";
var toMessages = (messages) => messages.map((m) => typeof m === "string" ? { role: "user", content: m } : m);
var TypeId4 = "~agentfly/Environment/Provider";
var EnvErrorReason = Schema9.Literals(["Crashed", "Timeout", "ResetFailed", "InvalidAction", "Unavailable"]);
var EnvError = class extends Schema9.TaggedError()("EnvError", {
  env: Schema9.String,
  method: Schema9.String,
  reason: EnvErrorReason,
  message: Schema9.String
}) {
  get isRetryable() {
    return this.reason === "Crashed" || this.reason === "Timeout" || this.reason === "Unavailable";
  }
};
var isProvider = (u) => typeof u === "object" && u !== null && TypeId4 in u;
var make3 = (sharing, acquire, stats) => ({ [TypeId4]: TypeId4, sharing, acquire, ...stats === void 0 ? {} : { stats } });
var buildFresh = (layer4) => Effect7.flatMap(Effect7.scope, (scope) => Layer3.buildWithMemoMap(layer4, Layer3.makeMemoMapUnsafe(), scope));
var perChain = (layer4) => make3("perChain", () => buildFresh(layer4));
var none = make3("shared", () => Effect7.succeed(Context2.empty()));

// src/Task.ts
import { Context as Context3, Effect as Effect8, Option as Option3, Schema as Schema10 } from "effect";
var TypeId5 = "~agentfly/Task";
var Ref = Schema10.Union([
  Schema10.String,
  Schema10.Struct({ name: Schema10.String, options: Schema10.optionalKey(Schema10.Record(Schema10.String, Schema10.Unknown)) })
]);
var TaskErrorReason = Schema10.Literals(["Unknown", "Module", "Options", "MissingServices", "Environment"]);
var TaskError = class extends Schema10.TaggedError()("TaskError", {
  task: Schema10.String,
  reason: TaskErrorReason,
  message: Schema10.String
}) {
};
var make4 = (name2, options) => {
  const tools = options.tools ?? [];
  const needs = [...tools.flatMap((t) => t.dependencies), ...options.reward?.dependencies ?? []];
  return {
    [TypeId5]: TypeId5,
    name: name2,
    description: options.description,
    row: options.row,
    prompt: options.prompt,
    tools,
    reward: options.reward,
    environment: options.environment,
    layer: options.layer,
    episode: options.episode,
    policies: options.policies,
    defaults: options.defaults ?? {},
    correct: options.correct,
    needs: [...new Map(needs.map((key2) => [key2.key, key2])).values()]
  };
};
var withOptions = (name2, schema, make22) => (options) => Schema10.decodeUnknownEffect(schema)(options ?? {}, {
  onExcessProperty: "error",
  errors: "all"
}).pipe(
  Effect8.map(make22),
  Effect8.mapError((e) => new TaskError({ task: name2, reason: "Options", message: `task options: ${e.message}` }))
);
var conversation = (task2, row, systemPrompt2) => {
  if (task2.prompt !== void 0) {
    return task2.prompt({ question: row.question, messages: row.messages, fields: row.fields }, systemPrompt2);
  }
  if (row.messages !== void 0 && row.messages.length > 0) return row.messages;
  const user = { role: "user", content: row.question ?? "" };
  return systemPrompt2 === void 0 ? [user] : [{ role: "system", content: systemPrompt2 }, user];
};
var missingServices = (task2, context) => task2.needs.filter((key2) => Option3.isNone(Context3.getOption(context, key2))).map(
  (key2) => key2.key
);

// actors/RolloutChain.ts
import { Clock, Context as Context4, Effect as Effect9, Schedule } from "effect";
var noTools = {
  schemas: [],
  executeTurn: (calls) => Effect9.succeed({
    messages: calls.map((call2) => ({
      role: "tool",
      content: `unknown tool: ${call2.function.name}`,
      tool_call_id: call2.id,
      is_error: true
    })),
    terminal: false
  })
};
var toolsFromActor = (actor) => ({
  schemas: actor.functionSchemas,
  executeTurn: (calls, context) => actor.executeTurn(calls, { context }).pipe(
    Effect9.map((turn) => ({
      messages: turn.messages,
      terminal: turn.terminal,
      errors: turn.results.flatMap((r) => r.error === void 0 ? [] : [r.error.reason])
    })),
    Effect9.mapError(
      (error2) => new RolloutError({
        reason: error2.reason === "MissingEnvironment" || error2.reason === "HandlerFailure" && error2.isRetryable ? "EnvFailed" : "ToolFailed",
        message: `${error2.tool}: ${error2.message}`
      })
    )
  )
});
var rewardFromActor = (actor) => (trajectory, context) => Effect9.map(actor.score(trajectory, { context }), ({ trajectory: scored }) => ({
  reward: scored.reward,
  status: scored.rewardStatus,
  metrics: scored.metrics,
  masked: scored.masked
}));
var makeStats = () => ({
  chainsInFlight: 0,
  chainsStarted: 0,
  chainsFinished: 0,
  turns: 0,
  tokensGenerated: 0,
  samplerCalls: 0,
  samplerLatencyMs: 0,
  restarts: 0,
  groupsEmitted: 0,
  groupsDropped: 0,
  toolCalls: /* @__PURE__ */ new Map(),
  terminations: /* @__PURE__ */ new Map(),
  errors: /* @__PURE__ */ new Map()
});
var bump = (map, key2, by = 1) => map.set(key2, (map.get(key2) ?? 0) + by);
var defaultRetry = Schedule.max([Schedule.exponential(100).pipe(Schedule.jittered), Schedule.recurs(5)]);
var withPolicy = (config, step3) => (
  // The retry schedule is only set up once a step has failed: the happy path pays for one `catch`.
  Effect9.catch(step3, (error2) => policyFor(error2.reason, config.policies) === "retry" ? step3.pipe(
    Effect9.retry({
      schedule: config.retry ?? defaultRetry,
      while: (e) => policyFor(e.reason, config.policies) === "retry"
    }),
    Effect9.catch((e) => resolve(config, e))
  ) : resolve(config, error2))
);
var resolve = (config, error2) => {
  bump(config.stats.errors, error2.reason);
  const declared = policyFor(error2.reason, config.policies);
  const policy = declared === "retry" ? afterRetry(config.policies) : declared;
  return policy === "abort_run" ? Effect9.fail(error2) : Effect9.succeed(new ResolvedError(error2, policy));
};
var ResolvedError = class {
  error;
  policy;
  constructor(error2, policy) {
    this.error = error2;
    this.policy = policy;
  }
};
var feedbackMessage = (error2, id) => ({
  role: "tool",
  content: error2.message,
  tool_call_id: id,
  is_error: true
});
var run = (spec, config) => Effect9.scoped(runScoped(spec, config));
var runScoped = Effect9.fnUntraced(function* (spec, config) {
  const stats = config.stats;
  const startedAt = yield* Clock.currentTimeMillis;
  const local = { turns: 0, toolCalls: 0, tokens: 0, samplerMs: 0, toolErrors: /* @__PURE__ */ new Map() };
  const rowIndex = spec.rowIndex ?? 0;
  const seed = spec.episodeSeed ?? 0;
  const row = spec.row ?? {};
  const acquired = yield* withPolicy(
    config,
    config.environment.acquire({ chainId: spec.chainId, groupId: spec.groupId, rowIndex, row, seed }).pipe(
      Effect9.map((context) => context),
      Effect9.mapError(
        (e) => new RolloutError({ reason: "LeaseFailed", message: errorText(e), chainId: spec.chainId })
      )
    )
  );
  if (acquired instanceof ResolvedError) {
    return yield* finish3(spec, config, void 0, Context4.empty(), local, startedAt, toEnding(acquired));
  }
  const env = acquired;
  let prompt = spec.messages;
  const episodeStart = config.episode?.start;
  if (episodeStart !== void 0) {
    const first = yield* withPolicy(
      config,
      inEnvironment(
        episodeStart({ chainId: spec.chainId, groupId: spec.groupId, rowIndex, row, seed, messages: spec.messages }),
        env,
        "start"
      )
    );
    if (first instanceof ResolvedError) {
      return yield* finish3(spec, config, void 0, env, local, startedAt, toEnding(first));
    }
    if (first !== void 0 && first.length > 0) prompt = [...prompt, ...toMessages(first)];
  }
  const started = yield* withPolicy(config, config.format.start(prompt, config.tools.schemas));
  if (started instanceof ResolvedError) {
    return yield* finish3(spec, config, void 0, env, local, startedAt, toEnding(started));
  }
  const transcript = started;
  const stopTokenIds = [...config.sampling.stopTokenIds ?? [], ...config.format.stopTokenIds];
  const ending = yield* Effect9.gen(function* () {
    while (true) {
      if (local.turns >= config.maxTurns) return { termination: "max_turns" };
      const remaining = config.maxContextTokens === void 0 ? Number.POSITIVE_INFINITY : config.maxContextTokens - transcript.length();
      if (remaining <= 0) return { termination: "context_length" };
      const maxTokens = Math.min(config.sampling.maxTokens, remaining);
      const before = transcript.length();
      const turn = yield* sampleTurn(spec, config, transcript, { ...config.sampling, maxTokens, stopTokenIds }, local);
      if (turn instanceof ResolvedError) return toEnding(turn);
      const generated = transcript.length() - before;
      stats.tokensGenerated += generated;
      local.tokens += generated;
      local.turns++;
      stats.turns++;
      if (!turn.complete) {
        return { termination: maxTokens < config.sampling.maxTokens ? "context_length" : "stop" };
      }
      const feedback = [];
      if (turn.parseErrors.length > 0) {
        const resolved = yield* resolve(
          config,
          new RolloutError({
            reason: "ParseFailed",
            message: `could not parse the tool call: ${turn.parseErrors.join("; ")}`,
            chainId: spec.chainId
          })
        );
        if (resolved.policy !== "feedback") return toEnding(resolved);
        feedback.push(feedbackMessage(resolved.error, `parse_error_${local.turns}`));
      } else if (turn.toolCalls.length === 0 && config.episode?.step === void 0) {
        return { termination: "no_tool_call" };
      }
      let observations2 = feedback;
      let terminal = false;
      if (turn.toolCalls.length > 0) {
        local.toolCalls += turn.toolCalls.length;
        for (const call2 of turn.toolCalls) bump(stats.toolCalls, call2.function.name);
        const executed = yield* withPolicy(config, config.tools.executeTurn(turn.toolCalls, env));
        if (executed instanceof ResolvedError) {
          if (executed.policy !== "feedback" || !canFeedBack(executed.error.reason)) {
            return toEnding(executed);
          }
          observations2 = [...turn.toolCalls.map((call2) => feedbackMessage(executed.error, call2.id)), ...feedback];
        } else {
          observations2 = [...executed.messages, ...feedback];
          terminal = executed.terminal;
          for (const reason of executed.errors ?? []) bump(local.toolErrors, reason);
        }
      }
      let end;
      const episodeStep = config.episode?.step;
      if (episodeStep !== void 0 && !terminal) {
        const said = yield* withPolicy(
          config,
          inEnvironment(episodeStep({ turn: local.turns, assistant: turn.message, observations: observations2 }), env, "step")
        );
        if (said instanceof ResolvedError) return toEnding(said);
        if (said !== void 0) {
          observations2 = [...observations2, ...toMessages(said.messages ?? [])];
          end = said.end;
        }
        if (observations2.length === 0 && end === void 0) return { termination: "no_tool_call" };
      }
      if (observations2.length > 0) {
        const appended = yield* withPolicy(config, transcript.appendObservations(observations2));
        if (appended instanceof ResolvedError) return toEnding(appended);
      }
      if (terminal) return { termination: "answer" };
      if (end !== void 0) return { termination: "episode_end", episodeEnd: end };
      if (config.maxContextTokens !== void 0 && transcript.length() >= config.maxContextTokens) {
        return { termination: "context_length" };
      }
    }
  });
  return yield* finish3(spec, config, transcript, env, local, startedAt, ending);
});
var sampleTurn = (spec, config, transcript, sampling, local) => {
  const backend = config.backend;
  const timed = (call2) => Effect9.flatMap(Clock.currentTimeMillis, (t0) => Effect9.ensuring(
    call2,
    Effect9.map(Clock.currentTimeMillis, (t1) => {
      config.stats.samplerCalls++;
      config.stats.samplerLatencyMs += t1 - t0;
      local.samplerMs += t1 - t0;
    })
  ));
  const fromSampler = (e) => fromSamplerError(e, spec.chainId);
  if (backend._tag === "Tokens") {
    return Effect9.flatMap(
      timed(withPolicy(
        config,
        Effect9.mapError(
          backend.sampler.generate({ promptTokenIds: transcript.promptTokenIds(), sampling }),
          fromSampler
        )
      )),
      (sampled) => sampled instanceof ResolvedError ? Effect9.succeed(sampled) : withPolicy(config, transcript.appendSampled(sampled))
    );
  }
  const appendAssistant2 = transcript.appendAssistant;
  if (appendAssistant2 === void 0) {
    return resolve(
      config,
      new RolloutError({
        reason: "TemplateFailed",
        message: "this format cannot append a recorded assistant message (chat mode)",
        chainId: spec.chainId
      })
    );
  }
  return Effect9.flatMap(
    timed(withPolicy(
      config,
      Effect9.mapError(
        backend.chat.complete({ messages: transcript.messages(), tools: config.tools.schemas, sampling }),
        fromSampler
      )
    )),
    (reply) => reply instanceof ResolvedError ? Effect9.succeed(reply) : withPolicy(
      config,
      Effect9.map(
        appendAssistant2({
          role: "assistant",
          content: reply.content,
          ...reply.toolCalls.length === 0 ? {} : { tool_calls: reply.toolCalls }
        }),
        (turn) => ({ ...turn, complete: reply.finishReason !== "length" })
      )
    )
  );
};
var inEnvironment = (effect, env, method) => effect.pipe(
  Effect9.provideContext(env),
  Effect9.mapError(
    (e) => new RolloutError({
      reason: "EnvFailed",
      message: `episode ${method}: ${typeof e === "object" && e !== null && "message" in e ? e.message : String(e)}`
    })
  )
);
var toEnding = (resolved) => ({
  termination: "error",
  error: resolved.error,
  policy: resolved.policy === "feedback" ? "mask" : resolved.policy
});
var errorText = (e) => typeof e === "object" && e !== null && "message" in e ? String(e.message) : String(e);
var clipped = (segments, maxTokens) => maxTokens === void 0 ? segments : segments.map((segment) => clipSegment(segment, maxTokens));
var finish3 = Effect9.fnUntraced(function* (spec, config, transcript, env, local, startedAt, ending) {
  const endedAt = yield* Clock.currentTimeMillis;
  const masked = ending.policy === "mask" || ending.policy === "drop_group";
  let trajectory = {
    trajectoryId: spec.trajectoryId,
    groupId: spec.groupId,
    chainId: spec.chainId,
    messages: transcript?.messages() ?? spec.messages,
    segments: clipped(transcript?.segments() ?? [], config.maxContextTokens),
    termination: ending.termination,
    reward: 0,
    rewardStatus: masked ? "failed" : "pending",
    metrics: {
      turns: local.turns,
      tool_calls: local.toolCalls,
      tokens_generated: local.tokens,
      sampler_latency_ms: local.samplerMs,
      rollout_time_ms: endedAt - startedAt,
      ...Object.fromEntries([...local.toolErrors].map(([reason, n]) => [`tool_errors/${reason}`, n]))
    },
    trainable: config.backend._tag === "Tokens",
    masked,
    ...spec.row === void 0 ? {} : { row: spec.row },
    ...ending.error === void 0 ? {} : { error: `${ending.error.reason}: ${ending.error.message}`, errorReason: ending.error.reason },
    ...ending.episodeEnd === void 0 ? {} : { episodeEnd: ending.episodeEnd }
  };
  let dropGroup = ending.policy === "drop_group";
  if (ending.policy === "zero_reward") {
    trajectory = { ...trajectory, reward: 0, rewardStatus: "scored" };
  } else if (!masked) {
    const scored = yield* score(trajectory, config, env);
    trajectory = scored.trajectory;
    dropGroup = scored.dropGroup;
  }
  bump(config.stats.terminations, trajectory.termination);
  return { trajectory, dropGroup };
});
var score = Effect9.fnUntraced(function* (trajectory, config, env) {
  if (config.reward === void 0) {
    return { trajectory: { ...trajectory, rewardStatus: "not_applicable" }, dropGroup: false };
  }
  const scored = yield* withPolicy(config, config.reward(trajectory, env));
  if (scored instanceof ResolvedError) {
    const masked = scored.policy === "mask" || scored.policy === "drop_group";
    return {
      trajectory: {
        ...trajectory,
        reward: 0,
        rewardStatus: masked ? "failed" : "scored",
        masked: trajectory.masked || masked,
        error: `${scored.error.reason}: ${scored.error.message}`,
        errorReason: scored.error.reason
      },
      dropGroup: scored.policy === "drop_group"
    };
  }
  return {
    trajectory: {
      ...trajectory,
      reward: scored.reward,
      rewardStatus: scored.status,
      metrics: { ...trajectory.metrics, ...scored.metrics },
      masked: trajectory.masked || scored.masked === true
    },
    dropGroup: false
  };
});

// actors/TaskRuntime.ts
import { Context as Context10, Duration as Duration6, Effect as Effect31, Exit as Exit4, Layer as Layer8, Scope as Scope2 } from "effect";

// actors/RewardActor.ts
import { Cause as Cause2, Context as Context8, Duration as Duration4, Effect as Effect29, Exit as Exit2, Option as Option6, Semaphore as Semaphore2 } from "effect";

// src/onnx/internal/protobuf.ts
var message = () => ({ chunks: [], length: 0 });
var push = (m, bytes2) => {
  m.chunks.push(bytes2);
  m.length += bytes2.length;
};
var varint = (n) => {
  let v = BigInt.asUintN(64, BigInt(n));
  const out = [];
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) b |= 128;
    out.push(b);
  } while (v !== 0n);
  return Uint8Array.from(out);
};
var smallVarint = (n) => {
  if (n >= 0 && n < 128) return Uint8Array.of(n);
  if (n >= 0 && n < 16384) return Uint8Array.of(n & 127 | 128, n >>> 7);
  return varint(n);
};
var key = (field, wire) => smallVarint(field << 3 | wire);
var int = (m, field, n) => {
  push(m, key(field, 0));
  push(m, typeof n === "number" ? smallVarint(n) : varint(n));
};
var float = (m, field, x) => {
  push(m, key(field, 5));
  const b = new Uint8Array(4);
  new DataView(b.buffer).setFloat32(0, x, true);
  push(m, b);
};
var bytes = (m, field, data) => {
  push(m, key(field, 2));
  push(m, smallVarint(data.length));
  if (data.length > 0) push(m, data);
};
var encoder = new TextEncoder();
var string = (m, field, s) => bytes(m, field, encoder.encode(s));
var nested = (m, field, child) => {
  push(m, key(field, 2));
  push(m, smallVarint(child.length));
  for (const c of child.chunks) m.chunks.push(c);
  m.length += child.length;
};
var packedInts = (m, field, values) => {
  const parts = values.map((v) => typeof v === "number" ? smallVarint(v) : varint(v));
  const body2 = message();
  for (const p of parts) push(body2, p);
  nested(m, field, body2);
};
var packedFloats = (m, field, values) => {
  const b = new Uint8Array(values.length * 4);
  const view = new DataView(b.buffer);
  values.forEach((v, i) => view.setFloat32(i * 4, v, true));
  bytes(m, field, b);
};
var finish4 = (m) => {
  const out = new Uint8Array(m.length);
  let offset = 0;
  for (const c of m.chunks) {
    out.set(c, offset);
    offset += c.length;
  }
  return out;
};

// src/onnx/Graph.ts
var make5 = (name2) => {
  const nodes = [];
  const inputs = [];
  const outputs = [];
  const initializers = /* @__PURE__ */ new Map();
  const used = /* @__PURE__ */ new Set();
  let counter = 0;
  const claim = (n) => {
    if (used.has(n) && !initializers.has(n)) throw new Error(`Graph ${name2}: value name "${n}" is already defined`);
    used.add(n);
    return n;
  };
  const fresh = (prefix) => {
    let n = `${prefix}_${counter++}`;
    while (used.has(n)) n = `${prefix}_${counter++}`;
    used.add(n);
    return n;
  };
  const node = (op2, ins, outs, attributes = {}, domain) => {
    for (const o of outs) if (!used.has(o)) used.add(o);
    nodes.push(domain === void 0 ? { op: op2, inputs: ins, outputs: outs, attributes } : {
      op: op2,
      inputs: ins,
      outputs: outs,
      attributes,
      domain
    });
    return outs;
  };
  const initializer = (n, tensor2) => {
    checkTensor(n, tensor2);
    if (initializers.has(n)) throw new Error(`Graph ${name2}: initializer "${n}" is already defined`);
    claim(n);
    initializers.set(n, tensor2);
    return n;
  };
  return {
    name: name2,
    nodes,
    inputs,
    outputs,
    initializers,
    fresh,
    node,
    input: (n, dtype, shape) => {
      claim(n);
      inputs.push({ name: n, dtype, shape: [...shape] });
      return n;
    },
    initializer,
    constant: (tensor2) => {
      checkTensor("constant", tensor2);
      const n = fresh("const");
      initializers.set(n, tensor2);
      return n;
    },
    op: (op2, ins, attributes) => node(op2, ins, [fresh(op2)], attributes)[0],
    opN: (op2, ins, count, attributes) => node(op2, ins, Array.from({ length: count }, () => fresh(op2)), attributes),
    output: (n, dtype, shape) => {
      outputs.push({ name: n, dtype, shape: [...shape] });
    }
  };
};
var elementCount = (dims) => dims.reduce((a, b) => a * b, 1);
var checkTensor = (name2, t) => {
  const n = elementCount(t.dims);
  if (t.data.length !== n) {
    throw new Error(`tensor ${name2}: dims [${t.dims.join(", ")}] need ${n} elements, data has ${t.data.length}`);
  }
};
var int2 = (value) => ({ kind: "int", value });
var float2 = (value) => ({ kind: "float", value });
var ints = (value) => ({ kind: "ints", value });
var string2 = (value) => ({ kind: "string", value });
var tensor = (value) => ({ kind: "tensor", value });
var int64 = (dims, values) => ({
  dtype: "int64",
  dims,
  data: BigInt64Array.from(values, (v) => BigInt(v))
});
var dataTypeCode = {
  float32: 1,
  int32: 6,
  int64: 7,
  bool: 9,
  float64: 11
};
var tensorProto = (name2, t) => {
  const m = message();
  if (t.dims.length > 0) packedInts(m, 1, t.dims);
  int(m, 2, dataTypeCode[t.dtype]);
  string(m, 8, name2);
  bytes(m, 9, new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  return m;
};
var attributeProto = (name2, a) => {
  const m = message();
  string(m, 1, name2);
  switch (a.kind) {
    case "float":
      float(m, 2, a.value);
      int(m, 20, 1);
      break;
    case "int":
      int(m, 3, BigInt(a.value));
      int(m, 20, 2);
      break;
    case "string":
      string(m, 4, a.value);
      int(m, 20, 3);
      break;
    case "tensor":
      nested(m, 5, tensorProto("", a.value));
      int(m, 20, 4);
      break;
    case "floats":
      packedFloats(m, 7, a.value);
      int(m, 20, 6);
      break;
    case "ints":
      packedInts(m, 8, a.value.map((v) => BigInt(v)));
      int(m, 20, 7);
      break;
  }
  return m;
};
var valueInfoProto = (v) => {
  const shape = message();
  for (const d of v.shape) {
    const dim = message();
    if (typeof d === "number") int(dim, 1, d);
    else string(dim, 2, d);
    nested(shape, 1, dim);
  }
  const tensorType = message();
  int(tensorType, 1, dataTypeCode[v.dtype]);
  nested(tensorType, 2, shape);
  const type = message();
  nested(type, 1, tensorType);
  const m = message();
  string(m, 1, v.name);
  nested(m, 2, type);
  return m;
};
var nodeProto = (n, index2) => {
  const m = message();
  for (const i of n.inputs) string(m, 1, i);
  for (const o of n.outputs) string(m, 2, o);
  string(m, 3, `${n.op}_n${index2}`);
  string(m, 4, n.op);
  for (const [k, a] of Object.entries(n.attributes)) nested(m, 5, attributeProto(k, a));
  if (n.domain !== void 0 && n.domain !== "") string(m, 7, n.domain);
  return m;
};
var toModelBytes = (graph, options = {}) => {
  const g = message();
  graph.nodes.forEach((n, i) => nested(g, 1, nodeProto(n, i)));
  string(g, 2, graph.name);
  for (const [name2, t] of graph.initializers) nested(g, 5, tensorProto(name2, t));
  for (const v of graph.inputs) nested(g, 11, valueInfoProto(v));
  for (const v of graph.outputs) nested(g, 12, valueInfoProto(v));
  const model = message();
  int(model, 1, options.irVersion ?? 8);
  string(model, 2, "agentfly");
  const domains = new Set(graph.nodes.flatMap((n) => n.domain ? [n.domain] : []));
  const opset = message();
  string(opset, 1, "");
  int(opset, 2, options.opset ?? 17);
  nested(model, 8, opset);
  for (const d of domains) {
    const o = message();
    string(o, 1, d);
    int(o, 2, 1);
    nested(model, 8, o);
  }
  nested(model, 7, g);
  return finish4(model);
};

// src/model/ModelConfig.ts
import { Effect as Effect10, Schema as Schema11 } from "effect";
var PositiveInt = Schema11.Int.check(Schema11.isGreaterThan(0));
var PositiveNumber = Schema11.Number.check(Schema11.isGreaterThan(0));
var Fields = Schema11.Struct({
  modelType: Schema11.Literal("qwen2"),
  vocabSize: PositiveInt,
  hiddenSize: PositiveInt,
  numHiddenLayers: PositiveInt,
  numAttentionHeads: PositiveInt,
  numKeyValueHeads: PositiveInt,
  intermediateSize: PositiveInt,
  maxPositionEmbeddings: PositiveInt,
  ropeTheta: PositiveNumber.pipe(Schema11.withDecodingDefaultKey(Effect10.succeed(1e4))),
  rmsNormEps: PositiveNumber.pipe(Schema11.withDecodingDefaultKey(Effect10.succeed(1e-6))),
  tieWordEmbeddings: Schema11.Boolean.pipe(Schema11.withDecodingDefaultKey(Effect10.succeed(false))),
  /** Qwen2 has biases on the q, k and v projections; `config.json` of Qwen2 models omits the key. */
  attentionBias: Schema11.Boolean.pipe(Schema11.withDecodingDefaultKey(Effect10.succeed(true))),
  /**
   * Adds learned absolute position embeddings (`model.embed_positions.weight`, GPT-2 style) to the token
   * embeddings, on top of RoPE. Not part of Qwen2; off by default. Tiny byte-level policies learn to copy digit
   * strings from their context much sooner with them.
   */
  learnedPositions: Schema11.Boolean.pipe(Schema11.withDecodingDefaultKey(Effect10.succeed(false))),
  bosTokenId: Schema11.optionalKey(Schema11.Int),
  eosTokenId: Schema11.optionalKey(Schema11.Union([Schema11.Int, Schema11.Array(Schema11.Int)]))
});
var shapeCheck = Schema11.makeFilter((c) => {
  const issues = [];
  if (c.hiddenSize % c.numAttentionHeads !== 0) {
    issues.push(`hidden_size ${c.hiddenSize} is not a multiple of num_attention_heads ${c.numAttentionHeads}`);
  } else if (c.hiddenSize / c.numAttentionHeads % 2 !== 0) {
    issues.push(`head dimension ${c.hiddenSize / c.numAttentionHeads} must be even for rotary embeddings`);
  }
  if (c.numAttentionHeads % c.numKeyValueHeads !== 0) {
    issues.push(
      `num_attention_heads ${c.numAttentionHeads} is not a multiple of num_key_value_heads ${c.numKeyValueHeads}`
    );
  }
  return issues;
});
var ModelConfig = Fields.check(shapeCheck).pipe(Schema11.encodeKeys({
  modelType: "model_type",
  vocabSize: "vocab_size",
  hiddenSize: "hidden_size",
  numHiddenLayers: "num_hidden_layers",
  numAttentionHeads: "num_attention_heads",
  numKeyValueHeads: "num_key_value_heads",
  intermediateSize: "intermediate_size",
  maxPositionEmbeddings: "max_position_embeddings",
  ropeTheta: "rope_theta",
  rmsNormEps: "rms_norm_eps",
  tieWordEmbeddings: "tie_word_embeddings",
  attentionBias: "attention_bias",
  learnedPositions: "learned_position_embeddings",
  bosTokenId: "bos_token_id",
  eosTokenId: "eos_token_id"
}));
var headDim = (c) => c.hiddenSize / c.numAttentionHeads;
var presets = {
  tiny: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 128,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    // Measured on the calculator warm-up (batch 16, LR 2e-3): with 2 shared KV heads two of three seeds had not
    // started copying digits after 1,000 steps; with one KV head per query head all three start at 550–650 steps.
    numKeyValueHeads: 4,
    intermediateSize: 512,
    maxPositionEmbeddings: 512,
    ropeTheta: 1e4,
    rmsNormEps: 1e-6,
    // Measured on the calculator warm-up (batch 16, LR 2e-3): with tied embeddings and RoPE alone the model never
    // learned to copy digits from its context in 1,800 steps (digit NLL stuck at ln 10); with learned positions and
    // an untied head it starts copying after ~450 steps.
    tieWordEmbeddings: false,
    attentionBias: true,
    learnedPositions: true
  },
  small: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 256,
    numHiddenLayers: 4,
    numAttentionHeads: 8,
    numKeyValueHeads: 2,
    intermediateSize: 1024,
    maxPositionEmbeddings: 1024,
    ropeTheta: 1e4,
    rmsNormEps: 1e-6,
    tieWordEmbeddings: true,
    attentionBias: true,
    learnedPositions: false
  },
  medium: {
    modelType: "qwen2",
    vocabSize: 288,
    hiddenSize: 768,
    numHiddenLayers: 12,
    numAttentionHeads: 12,
    numKeyValueHeads: 4,
    intermediateSize: 3072,
    maxPositionEmbeddings: 1024,
    ropeTheta: 1e4,
    rmsNormEps: 1e-6,
    tieWordEmbeddings: true,
    attentionBias: true,
    learnedPositions: false
  }
};
var decode = Schema11.decodeUnknownEffect(ModelConfig);
var toJson2 = (c) => ({
  architectures: ["Qwen2ForCausalLM"],
  ...Schema11.encodeSync(ModelConfig)(c),
  head_dim: headDim(c),
  hidden_act: "silu",
  torch_dtype: "float32"
});

// src/ModelFolder.ts
import { Effect as Effect13, FileSystem as FileSystem4, Path as Path4, Schema as Schema13 } from "effect";

// src/ByteTokenizer.ts
import { Effect as Effect11, FileSystem as FileSystem3, Path as Path3 } from "effect";
var defaultSpecialTokens = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  "<tool_call>",
  "</tool_call>",
  "<tool_response>",
  "</tool_response>",
  "<think>",
  "</think>"
];
var byteSymbols2 = (() => {
  const printable = (b) => b >= 33 && b <= 126 || b >= 161 && b <= 172 || b >= 174 && b <= 255;
  const out = [];
  let next = 256;
  for (let b = 0; b < 256; b++) out.push(String.fromCodePoint(printable(b) ? b : next++));
  return out;
})();
var byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
var tokenizerJson = (options = {}) => {
  const specials = options.specialTokens ?? defaultSpecialTokens;
  const vocab = {};
  byteSymbols2.forEach((symbol, byte) => {
    vocab[symbol] = byte;
  });
  const added = specials.map((content, i) => ({
    id: 256 + i,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: content.startsWith("<|")
  }));
  for (const token of added) vocab[token.content] = token.id;
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: null,
    decoder: byteLevel,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: []
    }
  };
};
var tokenizerConfig = (chatTemplate, options = {}) => ({
  tokenizer_class: "PreTrainedTokenizerFast",
  add_bos_token: false,
  add_prefix_space: false,
  bos_token: null,
  eos_token: options.eosToken ?? "<|im_end|>",
  pad_token: options.padToken ?? "<|endoftext|>",
  unk_token: null,
  clean_up_tokenization_spaces: false,
  model_max_length: 1 << 20,
  chat_template: chatTemplate
});
var vocabSize = (options = {}) => 256 + (options.specialTokens ?? defaultSpecialTokens).length;
var writeModelFiles = Effect11.fn("ByteTokenizer.writeModelFiles")(function* (dir, options = {}) {
  const fs = yield* FileSystem3.FileSystem;
  const path = yield* Path3.Path;
  yield* fs.makeDirectory(dir, { recursive: true });
  yield* fs.writeFileString(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJson(options)));
  yield* fs.writeFileString(
    path.join(dir, "tokenizer_config.json"),
    JSON.stringify(tokenizerConfig(options.chatTemplate ?? templates.chatml, options), null, 2)
  );
});

// src/Sampling.ts
var splitmix32 = (seed) => {
  let s = seed >>> 0;
  return () => {
    s = s + 2654435769 >>> 0;
    let z = s;
    z = Math.imul(z ^ z >>> 16, 2246822507);
    z = Math.imul(z ^ z >>> 13, 3266489909);
    return (z ^ z >>> 16) >>> 0;
  };
};
var rng = (seed) => {
  const mix = splitmix32(seed >>> 0 ^ Math.floor(seed / 4294967296));
  let a = mix(), b = mix(), c = mix(), d = mix();
  return {
    next: () => {
      const t = (a + b >>> 0) + d >>> 0;
      d = d + 1 >>> 0;
      a = b ^ b >>> 9;
      b = c + (c << 3) >>> 0;
      c = c << 21 | c >>> 11;
      c = c + t >>> 0;
      return t / 4294967296;
    }
  };
};
var normal = (r) => {
  const u = 1 - r.next();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * r.next());
};
var mulberry32 = (seed) => {
  let a = seed >>> 0;
  return () => {
    a = a + 1831565813 >>> 0;
    let t = a;
    t = Math.imul(t ^ t >>> 15, t | 1);
    t ^= t + Math.imul(t ^ t >>> 7, t | 61);
    return ((t ^ t >>> 14) >>> 0) / 4294967296;
  };
};

// src/model/Qwen2.ts
var parameters = (c) => {
  const D = c.hiddenSize, hd = headDim(c), F = c.intermediateSize;
  const qOut = c.numAttentionHeads * hd, kvOut = c.numKeyValueHeads * hd;
  const specs = [{ name: "model.embed_tokens.weight", shape: [c.vocabSize, D], init: "normal" }];
  if (c.learnedPositions) {
    specs.push({ name: "model.embed_positions.weight", shape: [c.maxPositionEmbeddings, D], init: "normal" });
  }
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = `model.layers.${i}`;
    specs.push({ name: `${p}.input_layernorm.weight`, shape: [D], init: "ones" });
    for (const [n, out] of [["q", qOut], ["k", kvOut], ["v", kvOut]]) {
      specs.push({ name: `${p}.self_attn.${n}_proj.weight`, shape: [out, D], init: "normal" });
      if (c.attentionBias) specs.push({ name: `${p}.self_attn.${n}_proj.bias`, shape: [out], init: "zeros" });
    }
    specs.push({ name: `${p}.self_attn.o_proj.weight`, shape: [D, qOut], init: "normal" });
    specs.push({ name: `${p}.post_attention_layernorm.weight`, shape: [D], init: "ones" });
    specs.push({ name: `${p}.mlp.gate_proj.weight`, shape: [F, D], init: "normal" });
    specs.push({ name: `${p}.mlp.up_proj.weight`, shape: [F, D], init: "normal" });
    specs.push({ name: `${p}.mlp.down_proj.weight`, shape: [D, F], init: "normal" });
  }
  specs.push({ name: "model.norm.weight", shape: [D], init: "ones" });
  if (!c.tieWordEmbeddings) specs.push({ name: "lm_head.weight", shape: [c.vocabSize, D], init: "normal" });
  return specs;
};
var initWeights = (c, seed, std = 0.02) => {
  const r = rng(seed);
  const weights = /* @__PURE__ */ new Map();
  for (const spec of parameters(c)) {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    if (spec.init === "ones") data.fill(1);
    else if (spec.init === "normal") for (let i = 0; i < n; i++) data[i] = normal(r) * std;
    weights.set(spec.name, data);
  }
  return weights;
};

// src/Safetensors.ts
import { Effect as Effect12, Schema as Schema12 } from "effect";
var byteSize = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1
};
var SafetensorsErrorReason = Schema12.Literals([
  "Corrupt",
  // truncated, bad header, offsets outside the data or overlapping
  "MissingTensor",
  // a tensor the model needs is absent
  "UnexpectedTensor",
  // a tensor the model does not have
  "ShapeMismatch",
  // present with the wrong shape
  "DTypeMismatch"
  // present with a dtype that cannot be used
]);
var SafetensorsError = class extends Schema12.TaggedError()("SafetensorsError", {
  reason: SafetensorsErrorReason,
  file: Schema12.String,
  tensor: Schema12.optionalKey(Schema12.String),
  message: Schema12.String
}) {
};
var HeaderEntry = Schema12.Struct({
  dtype: Schema12.Literals(["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"]),
  shape: Schema12.Array(Schema12.Int.check(Schema12.isGreaterThanOrEqualTo(0))),
  data_offsets: Schema12.Tuple([Schema12.Int, Schema12.Int])
});
var parse2 = Effect12.fnUntraced(function* (bytes2, file = "<memory>") {
  const corrupt = (message2, tensor2) => new SafetensorsError(
    tensor2 === void 0 ? { reason: "Corrupt", file, message: message2 } : { reason: "Corrupt", file, tensor: tensor2, message: message2 }
  );
  if (bytes2.length < 8) return yield* corrupt(`${file}: ${bytes2.length} bytes is too short for a safetensors file`);
  const view = new DataView(bytes2.buffer, bytes2.byteOffset, bytes2.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  if (headerLength > bytes2.length - 8) {
    return yield* corrupt(`${file}: header length ${headerLength} exceeds the file size ${bytes2.length} (truncated?)`);
  }
  const text4 = new TextDecoder("utf-8", { fatal: false }).decode(bytes2.subarray(8, 8 + headerLength));
  const header = yield* Effect12.try({
    try: () => JSON.parse(text4),
    catch: () => corrupt(`${file}: the header is not valid JSON`)
  });
  if (typeof header !== "object" || header === null || Array.isArray(header)) {
    return yield* corrupt(`${file}: the header is not a JSON object`);
  }
  const dataStart = 8 + headerLength, dataLength = bytes2.length - dataStart;
  const tensors = /* @__PURE__ */ new Map();
  const ranges = [];
  let metadata = {};
  for (const [name2, raw] of Object.entries(header)) {
    if (name2 === "__metadata__") {
      metadata = yield* Schema12.decodeUnknownEffect(Schema12.Record(Schema12.String, Schema12.String))(raw).pipe(
        Effect12.mapError(() => corrupt(`${file}: __metadata__ must map strings to strings`))
      );
      continue;
    }
    const entry = yield* Schema12.decodeUnknownEffect(HeaderEntry)(raw).pipe(
      Effect12.mapError((e) => corrupt(`${file}: tensor "${name2}" has a malformed header entry: ${e.message}`, name2))
    );
    const [begin, end] = entry.data_offsets;
    const expected = entry.shape.reduce((a, b) => a * b, 1) * byteSize[entry.dtype];
    if (begin < 0 || end < begin || end > dataLength) {
      return yield* corrupt(
        `${file}: tensor "${name2}" spans bytes [${begin}, ${end}) outside the ${dataLength} data bytes (truncated?)`,
        name2
      );
    }
    if (end - begin !== expected) {
      return yield* corrupt(
        `${file}: tensor "${name2}" ${entry.dtype}[${entry.shape.join(", ")}] needs ${expected} bytes, its offsets give ${end - begin}`,
        name2
      );
    }
    ranges.push([begin, end, name2]);
    const data = bytes2.subarray(dataStart + begin, dataStart + end);
    tensors.set(name2, { dtype: entry.dtype, shape: entry.shape, bytes: data });
  }
  ranges.sort((a, b) => a[0] - b[0]);
  for (let i = 1; i < ranges.length; i++) {
    if (ranges[i][0] < ranges[i - 1][1]) {
      return yield* corrupt(`${file}: tensors "${ranges[i - 1][2]}" and "${ranges[i][2]}" overlap`, ranges[i][2]);
    }
  }
  return { tensors, metadata };
});
var f16ToF32 = (h) => {
  const sign = h & 32768 ? -1 : 1, exp = h >> 10 & 31, frac = h & 1023;
  if (exp === 0) return sign * Math.pow(2, -14) * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * Math.pow(2, exp - 15) * (1 + frac / 1024);
};
var toFloat32 = (t, file, name2) => {
  const n = t.shape.reduce((a, b) => a * b, 1);
  const view = new DataView(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength);
  const out = new Float32Array(n);
  switch (t.dtype) {
    case "F32":
      new Uint8Array(out.buffer).set(t.bytes);
      return Effect12.succeed(out);
    case "F64":
      for (let i = 0; i < n; i++) out[i] = view.getFloat64(i * 8, true);
      return Effect12.succeed(out);
    case "F16":
      for (let i = 0; i < n; i++) out[i] = f16ToF32(view.getUint16(i * 2, true));
      return Effect12.succeed(out);
    case "BF16": {
      const bits = new Uint32Array(out.buffer);
      for (let i = 0; i < n; i++) bits[i] = view.getUint16(i * 2, true) << 16;
      return Effect12.succeed(out);
    }
    default:
      return Effect12.fail(
        new SafetensorsError({
          reason: "DTypeMismatch",
          file,
          tensor: name2,
          message: `${file}: tensor "${name2}" has dtype ${t.dtype}; a floating-point tensor is required`
        })
      );
  }
};
var serialize = (tensors, metadata) => {
  const header = metadata === void 0 ? {} : { __metadata__: metadata };
  let offset = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: "F32", shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(32);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at2 = 8 + json.length;
  for (const t of tensors) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at2);
    at2 += t.data.byteLength;
  }
  return out;
};
var readFloat32 = Effect12.fnUntraced(function* (parsed, file, expected) {
  const out = /* @__PURE__ */ new Map();
  for (const { name: name2, shape } of expected) {
    const t = parsed.tensors.get(name2);
    if (t === void 0) {
      return yield* new SafetensorsError({
        reason: "MissingTensor",
        file,
        tensor: name2,
        message: `${file}: tensor "${name2}" [${shape.join(", ")}] is missing`
      });
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      return yield* new SafetensorsError({
        reason: "ShapeMismatch",
        file,
        tensor: name2,
        message: `${file}: tensor "${name2}" has shape [${t.shape.join(", ")}], the model needs [${shape.join(", ")}]`
      });
    }
    out.set(name2, yield* toFloat32(t, file, name2));
  }
  for (const name2 of parsed.tensors.keys()) {
    if (!out.has(name2)) {
      return yield* new SafetensorsError({
        reason: "UnexpectedTensor",
        file,
        tensor: name2,
        message: `${file}: tensor "${name2}" is not a parameter of this model`
      });
    }
  }
  return out;
});

// src/ModelFolder.ts
var ModelFolderErrorReason = Schema13.Literals([
  "NotFound",
  // the folder or a required file is missing
  "InvalidConfig",
  // config.json is not valid JSON or not a valid Qwen2 config
  "InvalidWeights",
  // model.safetensors is corrupt or does not match the config
  "InvalidTokenizer",
  // tokenizer files are unusable, or the tokenizer has ids outside the model's vocabulary
  "InvalidTemplate",
  // no usable chat template
  "Io"
  // reading or writing failed
]);
var ModelFolderError = class extends Schema13.TaggedError()("ModelFolderError", {
  reason: ModelFolderErrorReason,
  file: Schema13.String,
  tensor: Schema13.optionalKey(Schema13.String),
  message: Schema13.String
}) {
};
var parseJson2 = (text4, file) => Effect13.try({
  try: () => JSON.parse(text4),
  catch: () => new ModelFolderError({ reason: "InvalidConfig", file, message: `${file} is not valid JSON` })
});
var readConfig = Effect13.fn("ModelFolder.readConfig")(function* (dir) {
  const fs = yield* FileSystem4.FileSystem;
  const path = yield* Path4.Path;
  const file = path.join(dir, "config.json");
  const text4 = yield* fs.readFileString(file).pipe(
    Effect13.mapError(() => new ModelFolderError({ reason: "NotFound", file, message: `cannot read ${file}` }))
  );
  return yield* decode(yield* parseJson2(text4, file)).pipe(
    Effect13.mapError((e) => new ModelFolderError({ reason: "InvalidConfig", file, message: `${file}: ${e.message}` }))
  );
});
var readWeights = Effect13.fn("ModelFolder.readWeights")(function* (dir, config) {
  const fs = yield* FileSystem4.FileSystem;
  const path = yield* Path4.Path;
  const file = path.join(dir, "model.safetensors");
  const bytes2 = yield* fs.readFile(file).pipe(
    Effect13.mapError(() => new ModelFolderError({ reason: "NotFound", file, message: `cannot read ${file}` }))
  );
  const invalid2 = (e) => new ModelFolderError(
    e.tensor === void 0 ? { reason: "InvalidWeights", file, message: e.message } : { reason: "InvalidWeights", file, tensor: e.tensor, message: e.message }
  );
  const parsed = yield* parse2(bytes2, file).pipe(Effect13.mapError(invalid2));
  const weights = yield* readFloat32(parsed, file, parameters(config)).pipe(
    Effect13.mapError(invalid2)
  );
  return weights;
});
var stopIds2 = Effect13.fnUntraced(function* (dir, tokenizer, template) {
  const fs = yield* FileSystem4.FileSystem;
  const path = yield* Path4.Path;
  const ids = /* @__PURE__ */ new Set();
  for (const t of template.stopTokens) {
    const id = tokenizer.tokenToId(t);
    if (id !== void 0) ids.add(id);
  }
  const file = path.join(dir, "generation_config.json");
  if (yield* fs.exists(file).pipe(Effect13.orElseSucceed(() => false))) {
    const text4 = yield* fs.readFileString(file).pipe(
      Effect13.mapError(() => new ModelFolderError({ reason: "Io", file, message: `cannot read ${file}` }))
    );
    const eos = (yield* parseJson2(text4, file))?.eos_token_id;
    for (const id of Array.isArray(eos) ? eos : [eos]) if (Number.isInteger(id)) ids.add(id);
  }
  return [...ids];
});
var load3 = Effect13.fn("ModelFolder.load")(function* (dir) {
  const path = yield* Path4.Path;
  const config = yield* readConfig(dir);
  const weights = yield* readWeights(dir, config);
  const tokenizerFile = path.join(dir, "tokenizer.json");
  const tokenizer = yield* load(dir).pipe(
    Effect13.mapError(
      (e) => new ModelFolderError({
        reason: e.reason === "NotFound" ? "NotFound" : "InvalidTokenizer",
        file: tokenizerFile,
        message: e.message
      })
    )
  );
  if (tokenizer.vocabSize > config.vocabSize) {
    return yield* new ModelFolderError({
      reason: "InvalidTokenizer",
      file: tokenizerFile,
      message: `the tokenizer has ${tokenizer.vocabSize} ids but config.json's vocab_size is ${config.vocabSize}`
    });
  }
  const template = yield* load2(dir).pipe(
    Effect13.mapError(
      (e) => new ModelFolderError({
        reason: "InvalidTemplate",
        file: path.join(dir, "tokenizer_config.json"),
        message: e.message
      })
    )
  );
  const stopTokenIds = yield* stopIds2(dir, tokenizer, template);
  const name2 = path.basename(path.resolve(dir));
  const folder = { dir, name: name2, config, weights, tokenizer, template, stopTokenIds };
  return folder;
});
var writeModel = Effect13.fn("ModelFolder.writeModel")(function* (dir, config, weights) {
  const fs = yield* FileSystem4.FileSystem;
  const path = yield* Path4.Path;
  const io2 = (file) => () => new ModelFolderError({ reason: "Io", file, message: `cannot write ${file}` });
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect13.mapError(io2(dir)));
  const tensors = parameters(config).map((spec) => ({
    name: spec.name,
    shape: spec.shape,
    data: weights.get(spec.name)
  }));
  const missing = tensors.find((t) => t.data === void 0);
  if (missing !== void 0) {
    return yield* new ModelFolderError({
      reason: "InvalidWeights",
      file: path.join(dir, "model.safetensors"),
      tensor: missing.name,
      message: `no weights for ${missing.name}`
    });
  }
  const configFile = path.join(dir, "config.json"), weightsFile = path.join(dir, "model.safetensors");
  yield* fs.writeFileString(configFile, JSON.stringify(toJson2(config), null, 2) + "\n").pipe(
    Effect13.mapError(io2(configFile))
  );
  yield* fs.writeFile(weightsFile, serialize(tensors, { format: "pt" })).pipe(
    Effect13.mapError(io2(weightsFile))
  );
});
var init = Effect13.fn("ModelFolder.init")(function* (dir, options) {
  const fs = yield* FileSystem4.FileSystem;
  const path = yield* Path4.Path;
  const preset = presets[options.preset];
  const tokenizerVocab = vocabSize();
  const eos = defaultSpecialTokens.indexOf("<|im_end|>") + 256;
  const endOfText = defaultSpecialTokens.indexOf("<|endoftext|>") + 256;
  const config = {
    ...preset,
    // Exactly the tokenizer's ids: a padded vocabulary would let a fresh policy sample ids no tokenizer can decode.
    vocabSize: tokenizerVocab,
    eosTokenId: eos
  };
  yield* writeModel(dir, config, initWeights(config, options.seed ?? 0));
  yield* writeModelFiles(dir, { chatTemplate: templates["qwen2.5"] }).pipe(
    Effect13.mapError(
      () => new ModelFolderError({ reason: "Io", file: dir, message: `cannot write tokenizer files in ${dir}` })
    )
  );
  const generationFile = path.join(dir, "generation_config.json");
  yield* fs.writeFileString(
    generationFile,
    JSON.stringify({ eos_token_id: [eos, endOfText], pad_token_id: endOfText, do_sample: true }, null, 2) + "\n"
  ).pipe(Effect13.mapError(
    () => new ModelFolderError({ reason: "Io", file: generationFile, message: `cannot write ${generationFile}` })
  ));
  return config;
});

// src/Tool.ts
var Tool_exports = {};
__export(Tool_exports, {
  EmptyParams: () => EmptyParams,
  ToolError: () => ToolError,
  ToolErrorReason: () => ToolErrorReason,
  errorText: () => errorText2,
  formatErrorOf: () => formatErrorOf,
  fromAi: () => fromAi,
  functionSchema: () => functionSchema,
  isTool: () => isTool,
  make: () => make6,
  methods: () => methods,
  parametersJsonSchema: () => parametersJsonSchema,
  renderValue: () => renderValue,
  truncate: () => truncate,
  truncationMarker: () => truncationMarker
});
import { Duration, Effect as Effect14, Schema as Schema14 } from "effect";
import { Tool as AiTool } from "effect/ai";
var TypeId6 = "~agentfly/Tool";
var EmptyParams = Schema14.Struct({});
var ToolErrorReason = Schema14.Literals([
  "DecodeError",
  "UnknownTool",
  "Timeout",
  "HandlerFailure",
  "InvalidResult",
  "Defect",
  "MissingEnvironment"
]);
var ToolError = class extends Schema14.TaggedError()("ToolError", {
  tool: Schema14.String,
  toolCallId: Schema14.String,
  reason: ToolErrorReason,
  message: Schema14.String,
  /** Set when the handler's failure declared itself retryable. */
  retryable: Schema14.optionalKey(Schema14.Boolean)
}) {
  get isRetryable() {
    return this.reason === "Timeout" || this.retryable === true;
  }
  /** The model's fault (a malformed call), as opposed to a failure at run time. */
  get isFormatError() {
    return this.reason === "DecodeError" || this.reason === "UnknownTool";
  }
};
var defaultRender = (encoded) => typeof encoded === "string" ? encoded : encoded === void 0 ? "" : JSON.stringify(encoded);
var make6 = (name2, options) => {
  const parametersSchema = options.parameters ?? EmptyParams;
  const successSchema = options.success ?? Schema14.String;
  const failureSchema = options.failure ?? Schema14.Never;
  return {
    [TypeId6]: TypeId6,
    name: name2,
    description: options.description,
    parametersSchema,
    successSchema,
    failureSchema,
    failureMode: options.failureMode ?? "return",
    dependencies: options.dependencies ?? [],
    terminal: options.terminal ?? false,
    strict: options.strict ?? true,
    timeout: options.timeout === void 0 ? void 0 : Duration.fromInputUnsafe(options.timeout),
    concurrency: options.concurrency,
    retry: options.retry,
    maxOutput: options.maxOutput,
    render: options.render,
    handler: options.handler,
    definition: AiTool.make(name2, {
      description: options.description,
      parameters: parametersSchema,
      success: successSchema,
      failure: failureSchema,
      failureMode: options.failureMode ?? "return"
    })
  };
};
var fromAi = (definition, options) => make6(definition.name, {
  ...options,
  description: options.description ?? AiTool.getDescription(definition) ?? "",
  parameters: definition.parametersSchema,
  success: definition.successSchema,
  failure: definition.failureSchema,
  failureMode: definition.failureMode
});
var isTool = (u) => typeof u === "object" && u !== null && TypeId6 in u;
var methods = (service, specs) => Object.entries(specs).flatMap(([method, spec]) => {
  if (spec === void 0) return [];
  const { call: call2, ...options } = spec;
  const invoke = call2 ?? ((instance, params) => Effect14.suspend(() => {
    const out = instance[method](params);
    return Effect14.isEffect(out) ? out : Effect14.succeed(out);
  }));
  return [make6(method, {
    ...options,
    dependencies: [service],
    handler: (params) => Effect14.flatMap(Effect14.service(service), (instance) => invoke(instance, params))
  })];
});
var parametersJsonSchema = (tool) => {
  const fields = tool.parametersSchema.fields;
  const schema = fields !== void 0 && Object.keys(fields).length === 0 ? { type: "object" } : { ...AiTool.getJsonSchema(tool.definition) };
  if (tool.strict && schema.type === "object") schema.additionalProperties = false;
  if (schema.type === "object" && schema.properties === void 0) schema.properties = {};
  return schema;
};
var functionSchema = (tool) => ({
  type: "function",
  function: { name: tool.name, description: tool.description, parameters: parametersJsonSchema(tool) }
});
var errorText2 = (reason, tool, detail) => {
  switch (reason) {
    case "DecodeError":
      return `Error: invalid arguments for tool "${tool}": ${detail}`;
    case "UnknownTool":
      return `Error: unknown tool "${tool}". ${detail}`;
    case "Timeout":
      return `Error: tool "${tool}" timed out after ${detail}.`;
    case "HandlerFailure":
      return `Error: ${detail}`;
    case "InvalidResult":
      return `Error: tool "${tool}" returned an invalid result.`;
    case "Defect":
      return `Error: tool "${tool}" failed with an internal error.`;
    case "MissingEnvironment":
      return `Error: tool "${tool}" is not available in this episode (${detail}).`;
  }
};
var formatPrefixes = [
  [/^Error: invalid arguments for tool "/, "DecodeError"],
  [/^Error: unknown tool "/, "UnknownTool"]
];
var formatErrorOf = (observation) => formatPrefixes.find(([re]) => re.test(observation))?.[1];
var renderValue = defaultRender;
var truncationMarker = (dropped, unit) => `
[... truncated: ${dropped} more ${unit}]`;
var cutChars = (text4, keep) => {
  const code = text4.charCodeAt(keep - 1);
  return text4.slice(0, code >= 55296 && code <= 56319 ? keep - 1 : keep);
};
var truncate = (text4, budget, tokenizer) => {
  let out = text4;
  let truncated = false;
  if (budget.chars !== void 0 && out.length > budget.chars) {
    const room = Math.max(0, budget.chars - truncationMarker(out.length, "characters").length);
    const head = cutChars(out, room);
    out = head + truncationMarker(out.length - head.length, "characters");
    if (out.length > budget.chars) out = out.slice(0, budget.chars);
    truncated = true;
  }
  if (budget.tokens !== void 0 && tokenizer !== void 0) {
    const ids = tokenizer.encode(out);
    if (ids.length > budget.tokens) {
      const marker2 = truncationMarker(ids.length, "tokens");
      let keep = Math.max(0, budget.tokens - tokenizer.encode(marker2).length);
      for (; ; ) {
        const candidate = tokenizer.decode(ids.slice(0, keep)) + truncationMarker(ids.length - keep, "tokens");
        const overflow = tokenizer.encode(candidate).length - budget.tokens;
        if (keep === 0 || overflow <= 0) {
          out = candidate;
          break;
        }
        keep = Math.max(0, keep - overflow);
      }
      truncated = true;
    }
  }
  return { text: out, truncated };
};

// src/Reward.ts
var Reward_exports = {};
__export(Reward_exports, {
  RewardError: () => RewardError,
  RewardErrorReason: () => RewardErrorReason,
  combine: () => combine,
  isReward: () => isReward,
  make: () => make7,
  notApplicable: () => notApplicable
});
import { Cause, Effect as Effect15, Exit, Option as Option4, Schema as Schema15 } from "effect";
var TypeId7 = "~agentfly/Reward";
var notApplicable = (reason) => ({ _tag: "NotApplicable", reason });
var RewardErrorReason = Schema15.Literals(["InvalidRow", "ScoreFailed", "InvalidScore", "Timeout", "Defect"]);
var RewardError = class extends Schema15.TaggedError()("RewardError", {
  reward: Schema15.String,
  reason: RewardErrorReason,
  message: Schema15.String
}) {
  get isRetryable() {
    return this.reason === "Timeout" || this.reason === "ScoreFailed";
  }
};
var describeFailure = (error2) => {
  if (typeof error2 === "object" && error2 !== null) {
    const message2 = error2.message;
    if (typeof message2 === "string" && message2.length > 0) return message2;
  }
  return String(error2);
};
var formatSchemaIssues = (message2) => message2.replace(/([^\n]+)\n\s*at (\[[^\n]*\])/g, "field $2: $1").replace(/\n\s*/g, "; ");
var finishScore = (name2, raw) => {
  const prefix = `reward/${name2}/`;
  if (typeof raw === "object" && "_tag" in raw) {
    return { _tag: "NotApplicable", reason: raw.reason, metrics: { [prefix + "not_applicable"]: 1 } };
  }
  const score2 = typeof raw === "number" ? { reward: raw } : raw;
  if (!Number.isFinite(score2.reward)) return `reward is ${score2.reward}`;
  const metrics = {};
  for (const [key2, value] of Object.entries(score2.metrics ?? {})) {
    if (!Number.isFinite(value)) return `metric "${key2}" is ${value}`;
    metrics[key2.startsWith("reward/") ? key2 : prefix + key2] = value;
  }
  metrics[prefix + "reward"] = score2.reward;
  return { _tag: "Scored", reward: score2.reward, metrics };
};
var make7 = (name2, options) => {
  const decodeRow = Schema15.decodeUnknownExit(options.row ?? Schema15.Struct({}));
  return {
    [TypeId7]: TypeId7,
    name: name2,
    dependencies: options.dependencies ?? [],
    evaluate: (input) => Effect15.suspend(() => {
      const row = decodeRow(input.row ?? input.trajectory.row ?? {});
      if (Exit.isFailure(row)) {
        const detail = Option4.match(Cause.findErrorOption(row.cause), {
          onNone: () => "invalid row",
          onSome: (e) => formatSchemaIssues(e.message)
        });
        return Effect15.fail(
          new RewardError({ reward: name2, reason: "InvalidRow", message: `reward "${name2}": dataset row ${detail}` })
        );
      }
      const response = input.response ?? finalResponse(input.trajectory);
      return options.score({ trajectory: input.trajectory, response, row: row.value }).pipe(
        Effect15.mapError(
          (error2) => error2 instanceof RewardError ? error2 : new RewardError({ reward: name2, reason: "ScoreFailed", message: describeFailure(error2) })
        ),
        Effect15.flatMap((raw) => {
          const outcome = finishScore(name2, raw);
          return typeof outcome === "string" ? Effect15.fail(new RewardError({ reward: name2, reason: "InvalidScore", message: outcome })) : Effect15.succeed(outcome);
        })
      );
    })
  };
};
var isReward = (u) => typeof u === "object" && u !== null && TypeId7 in u;
var combine = (name2, parts) => ({
  [TypeId7]: TypeId7,
  name: name2,
  dependencies: parts.flatMap((p) => p.reward.dependencies),
  evaluate: (input) => Effect15.map(
    Effect15.forEach(parts, (part) => part.reward.evaluate(input), { concurrency: "unbounded" }),
    (outcomes) => {
      let reward2 = 0;
      let applicable = 0;
      const metrics = {};
      outcomes.forEach((outcome, i) => {
        Object.assign(metrics, outcome.metrics);
        if (outcome._tag === "Scored") {
          reward2 += parts[i].weight * outcome.reward;
          applicable++;
        }
      });
      if (applicable === 0) {
        metrics[`reward/${name2}/not_applicable`] = 1;
        return { _tag: "NotApplicable", reason: "no part applies", metrics };
      }
      metrics[`reward/${name2}/reward`] = reward2;
      return { _tag: "Scored", reward: reward2, metrics };
    }
  )
});

// src/backends/OpenAiCompatSampler.ts
import { Clock as Clock2, Duration as Duration2, Effect as Effect16, Layer as Layer4, Option as Option5, Redacted, Schedule as Schedule2, Schema as Schema16 } from "effect";
import { HttpClient, HttpClientRequest } from "effect/http";
var CompletionChoice = Schema16.Struct({
  finish_reason: Schema16.optionalKey(Schema16.NullOr(Schema16.String)),
  token_ids: Schema16.optionalKey(Schema16.NullOr(Schema16.Array(Schema16.Int))),
  logprobs: Schema16.optionalKey(Schema16.NullOr(Schema16.Struct({
    tokens: Schema16.optionalKey(Schema16.NullOr(Schema16.Array(Schema16.String))),
    token_logprobs: Schema16.optionalKey(Schema16.NullOr(Schema16.Array(Schema16.NullOr(Schema16.Number))))
  }))),
  policy_version: Schema16.optionalKey(Schema16.Int)
});
var CompletionResponse = Schema16.Struct({
  choices: Schema16.Array(CompletionChoice).check(Schema16.isMinLength(1)),
  policy_version: Schema16.optionalKey(Schema16.Int)
});
var ChatChoice = Schema16.Struct({
  finish_reason: Schema16.optionalKey(Schema16.NullOr(Schema16.String)),
  message: Schema16.Struct({
    content: Schema16.optionalKey(Schema16.NullOr(Schema16.String)),
    tool_calls: Schema16.optionalKey(Schema16.NullOr(Schema16.Array(Schema16.Struct({
      id: Schema16.String,
      type: Schema16.optionalKey(Schema16.String),
      function: Schema16.Struct({ name: Schema16.String, arguments: Schema16.Unknown })
    }))))
  })
});
var ChatResponse = Schema16.Struct({
  choices: Schema16.Array(ChatChoice).check(Schema16.isMinLength(1))
});
var completionBody = (model, request, extra) => ({
  model,
  prompt: request.promptTokenIds,
  ...samplingFields(request.sampling),
  logprobs: 1,
  echo: false,
  return_token_ids: true,
  return_tokens_as_token_ids: true,
  skip_special_tokens: false,
  include_stop_str_in_output: true,
  ignore_eos: true,
  ...extra
});
var samplingFields = (sampling) => ({
  max_tokens: sampling.maxTokens,
  temperature: sampling.temperature,
  ...sampling.topP === void 0 ? {} : { top_p: sampling.topP },
  ...sampling.topK === void 0 ? {} : { top_k: sampling.topK },
  ...sampling.seed === void 0 ? {} : { seed: sampling.seed },
  ...sampling.stopTokenIds === void 0 ? {} : { stop_token_ids: sampling.stopTokenIds }
});
var tokenIdPattern = /^token_id:(-?\d+)$/;
var finishReasonOf = (raw) => raw === "length" ? "length" : "stop";
var readChoice = (choice) => {
  const fromTokens = choice.logprobs?.tokens?.map((t) => tokenIdPattern.exec(t)?.[1]);
  const tokenIds2 = choice.token_ids ?? (fromTokens !== void 0 && fromTokens.every((t) => t !== void 0) ? fromTokens.map(Number) : void 0);
  const logprobs2 = choice.logprobs?.token_logprobs;
  if (tokenIds2 === void 0 || logprobs2 === void 0 || logprobs2 === null) return void 0;
  if (logprobs2.length !== tokenIds2.length || logprobs2.some((lp) => lp === null)) return void 0;
  return { tokenIds: tokenIds2, logprobs: logprobs2 };
};
var retryAfterMs = (header, nowMs2) => {
  if (header === void 0) return void 0;
  const trimmed = header.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Number(trimmed) * 1e3;
  const at2 = Date.parse(trimmed);
  return Number.isNaN(at2) ? void 0 : Math.max(0, at2 - nowMs2);
};
var statusError = (status, body2, waitMs) => new SamplerError({
  ...waitMs === void 0 ? {} : { retryAfterMs: waitMs },
  reason: status === 429 ? "Overloaded" : status === 408 ? "Timeout" : status >= 500 ? "ServerError" : "BadRequest",
  message: `HTTP ${status}: ${body2.slice(0, 500)}`
});
var makePost = Effect16.fnUntraced(function* (config) {
  const client = yield* HttpClient.HttpClient;
  const timeoutMs = config.timeoutMs ?? 6e4;
  const maxRetryAfterMs = config.maxRetryAfterMs ?? 6e4;
  const retry = Schedule2.exponential(config.retryBaseMs ?? 200).pipe(
    Schedule2.jittered,
    Schedule2.setInputType(),
    Schedule2.modifyDelay(
      ({ duration, input }) => Effect16.succeed(Math.max(Duration2.toMillis(duration), Math.min(input.retryAfterMs ?? 0, maxRetryAfterMs)))
    )
  );
  const base = config.baseUrl.replace(/\/+$/, "");
  return (path, body2, schema) => {
    let request = HttpClientRequest.post(`${base}${path}`).pipe(
      HttpClientRequest.acceptJson,
      HttpClientRequest.bodyJsonUnsafe(body2)
    );
    if (config.apiKey !== void 0) request = HttpClientRequest.bearerToken(request, Redacted.value(config.apiKey));
    const attempt = client.execute(request).pipe(
      Effect16.mapError((error2) => new SamplerError({ reason: "Transport", message: String(error2.message) })),
      Effect16.flatMap(
        (response) => response.status >= 200 && response.status < 300 ? Effect16.flatMap(
          Effect16.mapError(response.json, (e) => new SamplerError({ reason: "ServerError", message: `unreadable body: ${e.message}` })),
          (json) => Effect16.mapError(Schema16.decodeUnknownEffect(schema)(json), (e) => new SamplerError({ reason: "ServerError", message: `unexpected response: ${e.message}` }))
        ) : Effect16.flatMap(
          Effect16.orElseSucceed(response.text, () => ""),
          (text4) => Effect16.flatMap(Clock2.currentTimeMillis, (now2) => Effect16.fail(statusError(response.status, text4, retryAfterMs(response.headers["retry-after"], now2))))
        )
      ),
      Effect16.timeoutOrElse({
        duration: timeoutMs,
        orElse: () => Effect16.fail(new SamplerError({ reason: "Timeout", message: `no answer from ${path} in ${timeoutMs} ms` }))
      })
    );
    return attempt.pipe(
      Effect16.retry({ schedule: retry, times: config.retries ?? 4, while: (e) => e.isRetryable })
    );
  };
});
var versionOf = (config) => {
  const v = config.policyVersion;
  return v === void 0 ? Effect16.succeed(0) : typeof v === "number" ? Effect16.succeed(v) : v;
};
var make8 = Effect16.fnUntraced(function* (config) {
  const post = yield* makePost(config);
  const policyVersion = versionOf(config);
  return Sampler.of({
    generate: Effect16.fn("OpenAiCompatSampler.generate")(function* (request) {
      const response = yield* post(
        "/completions",
        completionBody(config.model, request, config.extraBody),
        CompletionResponse
      );
      const choice = response.choices[0];
      const read4 = readChoice(choice);
      if (read4 === void 0) {
        return yield* new SamplerError({
          reason: "NoTokenIds",
          message: "the server returned no token ids or logprobs for the completion (vLLM needs return_token_ids or return_tokens_as_token_ids; this backend needs both ids and logprobs)"
        });
      }
      const result = {
        tokenIds: read4.tokenIds,
        logprobs: read4.logprobs,
        finishReason: finishReasonOf(choice.finish_reason),
        policyVersion: choice.policy_version ?? response.policy_version ?? (yield* policyVersion)
      };
      return result;
    }),
    policyVersion
  });
});
var chatBody = (model, request, extra) => {
  const { stop_token_ids: _ignored, ...sampling } = samplingFields(request.sampling);
  return {
    model,
    messages: toOpenAiMessages(request.messages),
    ...request.tools === void 0 || request.tools.length === 0 ? {} : { tools: request.tools },
    ...sampling,
    ...extra
  };
};
var toOpenAiMessages = (messages) => messages.map((m) => {
  if (m.role === "tool") {
    const { is_error: _isError, ...rest } = m;
    return rest;
  }
  if (m.role !== "assistant" || m.tool_calls === void 0) return m;
  return {
    ...m,
    tool_calls: m.tool_calls.map((c) => ({
      ...c,
      function: {
        name: c.function.name,
        arguments: typeof c.function.arguments === "string" ? c.function.arguments : JSON.stringify(c.function.arguments)
      }
    }))
  };
});
var decodeArguments = (raw) => typeof raw === "string" ? Option5.getOrElse(Schema16.decodeUnknownOption(Schema16.fromJsonString(Schema16.Unknown))(raw), () => raw) : raw;
var makeChat = Effect16.fnUntraced(function* (config) {
  const post = yield* makePost(config);
  return ChatSampler.of({
    complete: Effect16.fn("OpenAiCompatSampler.complete")(function* (request) {
      const response = yield* post(
        "/chat/completions",
        chatBody(config.model, request, config.extraBody),
        ChatResponse
      );
      const choice = response.choices[0];
      const toolCalls = (choice.message.tool_calls ?? []).map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.function.name, arguments: decodeArguments(c.function.arguments) }
      }));
      const result = {
        content: choice.message.content ?? "",
        toolCalls,
        finishReason: choice.finish_reason === "length" ? "length" : "stop"
      };
      return result;
    })
  });
});

// src/Advantage.ts
import { Effect as Effect17, Schema as Schema17 } from "effect";
var Estimator = Schema17.Literals(["grpo", "grpo-no-std", "rloo", "reinforce++", "reinforce++-baseline", "gae"]);
var AdvantageErrorReason = Schema17.Literals(["UnknownEstimator", "ShapeMismatch", "MissingValues", "NotFinite"]);
var AdvantageError = class extends Schema17.TaggedError()("AdvantageError", {
  reason: AdvantageErrorReason,
  message: Schema17.String
}) {
};
var included = (input, row) => input.include === void 0 || input.include[row] !== 0;
var rowScores = (input) => {
  const { batch, length, tokenRewards } = input;
  const scores = new Float64Array(batch);
  for (let b = 0; b < batch; b++) {
    let s = 0;
    for (let t = 0; t < length; t++) s += tokenRewards[b * length + t];
    scores[b] = s;
  }
  return scores;
};
var groupStats = (input, scores) => {
  const count = /* @__PURE__ */ new Map();
  const sum = /* @__PURE__ */ new Map();
  for (let b = 0; b < input.batch; b++) {
    if (!included(input, b)) continue;
    const g = input.groupIndex[b];
    count.set(g, (count.get(g) ?? 0) + 1);
    sum.set(g, (sum.get(g) ?? 0) + scores[b]);
  }
  const mean = /* @__PURE__ */ new Map();
  for (const [g, n] of count) mean.set(g, n > 1 ? sum.get(g) / n : 0);
  const sq = /* @__PURE__ */ new Map();
  for (let b = 0; b < input.batch; b++) {
    if (!included(input, b)) continue;
    const g = input.groupIndex[b];
    const d = scores[b] - mean.get(g);
    sq.set(g, (sq.get(g) ?? 0) + d * d);
  }
  const std = /* @__PURE__ */ new Map();
  for (const [g, n] of count) std.set(g, n > 1 ? Math.sqrt(sq.get(g) / (n - 1)) : 1);
  return { count, mean, std };
};
var broadcast = (input, perRow) => {
  const { batch, length, responseMask } = input;
  const out = new Float64Array(batch * length);
  for (let b = 0; b < batch; b++) {
    if (!included(input, b)) continue;
    const a = perRow(b);
    for (let t = 0; t < length; t++) if (responseMask[b * length + t] !== 0) out[b * length + t] = a;
  }
  return out;
};
var effectiveMask = (input) => {
  const mask = Uint8Array.from(input.responseMask);
  for (let b = 0; b < input.batch; b++) if (!included(input, b)) mask.fill(0, b * input.length, (b + 1) * input.length);
  return mask;
};
var maskedWhiten = (values, mask) => {
  let n = 0;
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    if (mask[i] !== 0) {
      n++;
      sum += values[i];
    }
  }
  if (n === 0) return values.fill(0);
  const mean = sum / n;
  let sq = 0;
  for (let i = 0; i < values.length; i++) if (mask[i] !== 0) sq += (values[i] - mean) ** 2;
  const variance = n > 1 ? sq / (n - 1) : sq / n;
  const scale = 1 / Math.sqrt(variance + 1e-8);
  for (let i = 0; i < values.length; i++) values[i] = mask[i] !== 0 ? (values[i] - mean) * scale : 0;
  return values;
};
var grpo = (normalizeByStd) => (input, config) => {
  const scores = rowScores(input);
  const { mean, std } = groupStats(input, scores);
  const advantages = broadcast(input, (b) => {
    const g = input.groupIndex[b];
    const centred = scores[b] - mean.get(g);
    return normalizeByStd ? centred / (std.get(g) + config.epsilon) : centred;
  });
  return { advantages, returns: advantages };
};
var rloo = (input) => {
  const scores = rowScores(input);
  const { count, mean } = groupStats(input, scores);
  const advantages = broadcast(input, (b) => {
    const g = input.groupIndex[b];
    const n = count.get(g);
    return n > 1 ? scores[b] * n / (n - 1) - mean.get(g) * n / (n - 1) : scores[b];
  });
  return { advantages, returns: advantages };
};
var reinforcePlusPlus = (input, config) => {
  const { batch, length, tokenRewards } = input;
  const mask = effectiveMask(input);
  const returns = new Float64Array(batch * length);
  for (let b = 0; b < batch; b++) {
    let running = 0;
    for (let t = length - 1; t >= 0; t--) {
      const i = b * length + t;
      running = tokenRewards[i] + config.gamma * running;
      returns[i] = running;
      running *= mask[i];
    }
  }
  return { advantages: maskedWhiten(Float64Array.from(returns), mask), returns };
};
var reinforcePlusPlusBaseline = (input) => {
  const scores = rowScores(input);
  const { mean } = groupStats(input, scores);
  const centred = broadcast(input, (b) => scores[b] - mean.get(input.groupIndex[b]));
  const advantages = maskedWhiten(centred, effectiveMask(input));
  return { advantages, returns: advantages };
};
var gae = (input, config) => {
  const { batch, length, tokenRewards } = input;
  const values = input.values;
  const mask = effectiveMask(input);
  const advantages = new Float64Array(batch * length);
  for (let b = 0; b < batch; b++) {
    let nextValue = 0;
    let lastGaeLam = 0;
    for (let t = length - 1; t >= 0; t--) {
      const i = b * length + t;
      const delta = tokenRewards[i] + config.gamma * nextValue - values[i];
      const gaeLam = delta + config.gamma * config.lambda * lastGaeLam;
      if (mask[i] !== 0) {
        nextValue = values[i];
        lastGaeLam = gaeLam;
      }
      advantages[i] = lastGaeLam;
    }
  }
  const returns = new Float64Array(batch * length);
  for (let i = 0; i < returns.length; i++) returns[i] = advantages[i] + values[i];
  return { advantages: maskedWhiten(advantages, mask), returns };
};
var registry = {
  "grpo": grpo(true),
  "grpo-no-std": grpo(false),
  "rloo": rloo,
  "reinforce++": reinforcePlusPlus,
  "reinforce++-baseline": reinforcePlusPlusBaseline,
  "gae": gae
};

// src/autodiff/Autodiff.ts
import { Effect as Effect18, Schema as Schema18 } from "effect";

// src/autodiff/Shapes.ts
var ShapeInferenceError = class extends Error {
  constructor(message2) {
    super(message2);
    this.name = "ShapeInferenceError";
  }
};
var codeToDType = {
  1: "float32",
  6: "int32",
  7: "int64",
  9: "bool",
  11: "float64"
};
var MAX_FOLD = 4096;
var size = (dims) => dims.reduce((a, b) => a * b, 1);
var isInt = (d) => d === "int64" || d === "int32" || d === "bool";
var make9 = (graph, dims) => {
  const table = /* @__PURE__ */ new Map();
  const get2 = (name2) => {
    const info = table.get(name2);
    if (info === void 0) throw new ShapeInferenceError(`no shape known for value "${name2}"`);
    return info;
  };
  for (const input of graph.inputs) {
    const concrete = input.shape.map((d) => {
      if (typeof d === "number") return d;
      const bound = dims[d];
      if (bound === void 0) throw new ShapeInferenceError(`input ${input.name}: symbolic dim "${d}" is not bound`);
      return bound;
    });
    table.set(input.name, { dtype: input.dtype, dims: concrete });
  }
  for (const [name2, t] of graph.initializers) table.set(name2, tensorInfo(t));
  const shapes = {
    get: get2,
    has: (name2) => table.has(name2),
    set: (name2, info) => void table.set(name2, info),
    visit: (node) => {
      const outs = infer(node, (name2) => name2 === "" ? void 0 : get2(name2));
      node.outputs.forEach((o, i) => {
        const info = outs[i];
        if (o !== "" && info !== void 0) table.set(o, info);
      });
    }
  };
  for (const node of graph.nodes) shapes.visit(node);
  return shapes;
};
var tensorInfo = (t) => ({
  dtype: t.dtype,
  dims: t.dims,
  value: isInt(t.dtype) && t.data.length <= MAX_FOLD ? Array.from(t.data, Number) : void 0
});
var attrInt = (node, name2, fallback) => {
  const a = node.attributes[name2];
  return a !== void 0 && a.kind === "int" ? a.value : fallback;
};
var attrInts = (node, name2) => {
  const a = node.attributes[name2];
  return a !== void 0 && a.kind === "ints" ? a.value : void 0;
};
var broadcast2 = (a, b) => {
  const rank = Math.max(a.length, b.length);
  const out = [];
  for (let i = 0; i < rank; i++) {
    const x = a[i - (rank - a.length)] ?? 1;
    const y = b[i - (rank - b.length)] ?? 1;
    if (x !== y && x !== 1 && y !== 1) throw new ShapeInferenceError(`cannot broadcast [${a}] with [${b}]`);
    out.push(x === 1 ? y : x);
  }
  return out;
};
var normAxis = (axis, rank) => axis < 0 ? axis + rank : axis;
var need = (info, what) => {
  if (info === void 0) throw new ShapeInferenceError(`missing ${what}`);
  return info;
};
var valueOf = (info, what) => {
  const v = need(info, what).value;
  if (v === void 0) throw new ShapeInferenceError(`${what} must be a constant (or computable from shapes)`);
  return v;
};
var foldBinary = (op2, a, b, dims) => {
  if (a.value === void 0 || b.value === void 0 || size(dims) > MAX_FOLD) return void 0;
  const f = {
    Add: (x, y) => x + y,
    Sub: (x, y) => x - y,
    Mul: (x, y) => x * y,
    Div: (x, y) => Math.trunc(x / y),
    Equal: (x, y) => Number(x === y),
    Less: (x, y) => Number(x < y),
    LessOrEqual: (x, y) => Number(x <= y),
    Greater: (x, y) => Number(x > y),
    And: (x, y) => Number(x !== 0 && y !== 0),
    Max: Math.max,
    Min: Math.min
  }[op2];
  if (f === void 0) return void 0;
  const idx = broadcastIndex(dims);
  return Array.from({ length: size(dims) }, (_, i) => f(a.value[idx(i, a.dims)], b.value[idx(i, b.dims)]));
};
var broadcastIndex = (dims) => (flat, src) => {
  let rem = flat;
  let index2 = 0;
  let stride = 1;
  for (let i = dims.length - 1; i >= 0; i--) {
    const coord = rem % dims[i];
    rem = Math.floor(rem / dims[i]);
    const j = i - (dims.length - src.length);
    if (j >= 0) {
      if (src[j] !== 1) index2 += coord * stride;
      stride *= src[j];
    }
  }
  return index2;
};
var sliceRange = (dim, start3, end) => {
  const s = start3 < 0 ? Math.max(0, start3 + dim) : Math.min(start3, dim);
  const e = end < 0 ? Math.max(0, end + dim) : Math.min(end, dim);
  return [s, Math.max(s, e)];
};
var sliceBounds = (dims, starts, ends, axes, steps) => {
  const bounds = dims.map((d) => [0, d]);
  starts.forEach((start3, i) => {
    if (steps !== void 0 && steps[i] !== 1) throw new ShapeInferenceError("Slice with steps other than 1");
    const axis = normAxis(axes?.[i] ?? i, dims.length);
    bounds[axis] = sliceRange(dims[axis], start3, ends[i]);
  });
  return bounds;
};
var unary = /* @__PURE__ */ new Set([
  "Neg",
  "Exp",
  "Log",
  "Sqrt",
  "Reciprocal",
  "Sigmoid",
  "Tanh",
  "Relu",
  "Abs",
  "Identity",
  "Softmax",
  "LogSoftmax",
  "Erf",
  "Not",
  "Floor",
  "Ceil",
  "Sign",
  "Clip"
]);
var binary = /* @__PURE__ */ new Set([
  "Add",
  "Sub",
  "Mul",
  "Div",
  "Pow",
  "Max",
  "Min",
  "Mod",
  "Equal",
  "Less",
  "LessOrEqual",
  "Greater",
  "GreaterOrEqual",
  "And",
  "Or"
]);
var comparisons = /* @__PURE__ */ new Set(["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Not"]);
var infer = (node, at2) => {
  const x = () => need(at2(node.inputs[0]), `input 0 of ${node.op}`);
  const op2 = node.op;
  if (unary.has(op2)) {
    const a = x();
    const value = op2 === "Identity" ? a.value : op2 === "Not" && a.value ? a.value.map((v) => Number(!v)) : void 0;
    return [{ dtype: comparisons.has(op2) ? "bool" : a.dtype, dims: a.dims, value }];
  }
  if (binary.has(op2)) {
    const a = x();
    const b = need(at2(node.inputs[1]), `input 1 of ${op2}`);
    const dims = broadcast2(a.dims, b.dims);
    return [{ dtype: comparisons.has(op2) ? "bool" : a.dtype, dims, value: foldBinary(op2, a, b, dims) }];
  }
  switch (op2) {
    case "Sum": {
      const infos = node.inputs.map((n) => need(at2(n), "Sum input"));
      return [{ dtype: infos[0].dtype, dims: infos.map((i) => i.dims).reduce(broadcast2) }];
    }
    case "Where": {
      const [c, a, b] = node.inputs.map((n) => need(at2(n), "Where input"));
      const dims = broadcast2(broadcast2(c.dims, a.dims), b.dims);
      const idx = broadcastIndex(dims);
      const pick = (i) => c.value[idx(i, c.dims)] ? a.value[idx(i, a.dims)] : b.value[idx(i, b.dims)];
      const value = c.value && a.value && b.value && size(dims) <= MAX_FOLD ? Array.from({ length: size(dims) }, (_, i) => pick(i)) : void 0;
      return [{ dtype: a.dtype, dims, value }];
    }
    case "Cast": {
      const a = x();
      const to = codeToDType[attrInt(node, "to", 1)];
      if (to === void 0) throw new ShapeInferenceError(`Cast to unsupported type ${attrInt(node, "to", 1)}`);
      const value = isInt(to) ? a.value?.map((v) => to === "bool" ? Number(v !== 0) : Math.trunc(v)) : void 0;
      return [{ dtype: to, dims: a.dims, value }];
    }
    case "MatMul": {
      const a = x();
      const b = need(at2(node.inputs[1]), "MatMul input 1");
      if (a.dims.length < 2 || b.dims.length < 2) {
        throw new ShapeInferenceError("MatMul on a 1-D operand is not supported");
      }
      if (a.dims.at(-1) !== b.dims.at(-2)) throw new ShapeInferenceError(`MatMul [${a.dims}] \xD7 [${b.dims}]`);
      const batch = broadcast2(a.dims.slice(0, -2), b.dims.slice(0, -2));
      return [{ dtype: a.dtype, dims: [...batch, a.dims.at(-2), b.dims.at(-1)] }];
    }
    case "FusedMatMul": {
      const swap = (d, t) => t ? [...d.slice(0, -2), d.at(-1), d.at(-2)] : d;
      const a = swap(x().dims, attrInt(node, "transA", 0) === 1);
      const b = swap(need(at2(node.inputs[1]), "FusedMatMul input 1").dims, attrInt(node, "transB", 0) === 1);
      if (a.at(-1) !== b.at(-2)) throw new ShapeInferenceError(`FusedMatMul [${a}] \xD7 [${b}]`);
      const batch = broadcast2(a.slice(0, -2), b.slice(0, -2));
      return [{ dtype: x().dtype, dims: [...batch, a.at(-2), b.at(-1)] }];
    }
    case "Gemm": {
      const a = x();
      const b = need(at2(node.inputs[1]), "Gemm input 1");
      const m = attrInt(node, "transA", 0) === 1 ? a.dims[1] : a.dims[0];
      const n = attrInt(node, "transB", 0) === 1 ? b.dims[0] : b.dims[1];
      return [{ dtype: a.dtype, dims: [m, n] }];
    }
    case "Transpose": {
      const a = x();
      const perm = attrInts(node, "perm") ?? a.dims.map((_, i) => a.dims.length - 1 - i);
      return [{ dtype: a.dtype, dims: perm.map((p) => a.dims[p]) }];
    }
    case "Reshape": {
      const a = x();
      const target = valueOf(at2(node.inputs[1]), "Reshape shape");
      const dims = target.map((d, i) => d === 0 ? a.dims[i] : d);
      const known = dims.filter((d) => d !== -1).reduce((p, d) => p * d, 1);
      const out = dims.map((d) => d === -1 ? size(a.dims) / known : d);
      if (size(out) !== size(a.dims)) throw new ShapeInferenceError(`Reshape [${a.dims}] to [${target}]`);
      return [{ dtype: a.dtype, dims: out, value: a.value }];
    }
    case "Flatten": {
      const a = x();
      const axis = normAxis(attrInt(node, "axis", 1), a.dims.length);
      return [{ dtype: a.dtype, dims: [size(a.dims.slice(0, axis)), size(a.dims.slice(axis))], value: a.value }];
    }
    case "Unsqueeze": {
      const a = x();
      const axes = valueOf(at2(node.inputs[1]), "Unsqueeze axes");
      const rank = a.dims.length + axes.length;
      const norm = new Set(axes.map((ax) => normAxis(ax, rank)));
      const dims = [];
      let j = 0;
      for (let i = 0; i < rank; i++) dims.push(norm.has(i) ? 1 : a.dims[j++]);
      return [{ dtype: a.dtype, dims, value: a.value }];
    }
    case "Squeeze": {
      const a = x();
      const axesInfo = node.inputs[1] ? at2(node.inputs[1]) : void 0;
      const axes = axesInfo ? valueOf(axesInfo, "Squeeze axes").map((ax) => normAxis(ax, a.dims.length)) : void 0;
      const dims = a.dims.filter((d, i) => axes ? !axes.includes(i) : d !== 1);
      return [{ dtype: a.dtype, dims, value: a.value }];
    }
    case "Concat": {
      const infos = node.inputs.map((n) => need(at2(n), "Concat input"));
      const axis = normAxis(attrInt(node, "axis", 0), infos[0].dims.length);
      const dims = [...infos[0].dims];
      dims[axis] = infos.reduce((s, i) => s + i.dims[axis], 0);
      const value = axis === 0 && infos[0].dims.length === 1 && infos.every((i) => i.value !== void 0) ? infos.flatMap((i) => i.value) : void 0;
      return [{ dtype: infos[0].dtype, dims, value }];
    }
    case "Split": {
      const a = x();
      const axis = normAxis(attrInt(node, "axis", 0), a.dims.length);
      const parts = node.inputs[1] ? valueOf(at2(node.inputs[1]), "Split sizes") : void 0;
      const n = node.outputs.length;
      return node.outputs.map((_, i) => {
        const dims = [...a.dims];
        dims[axis] = parts ? parts[i] : a.dims[axis] / n;
        return { dtype: a.dtype, dims };
      });
    }
    case "Slice": {
      const a = x();
      const starts = valueOf(at2(node.inputs[1]), "Slice starts");
      const ends = valueOf(at2(node.inputs[2]), "Slice ends");
      const axes = node.inputs[3] ? valueOf(at2(node.inputs[3]), "Slice axes") : void 0;
      const steps = node.inputs[4] ? valueOf(at2(node.inputs[4]), "Slice steps") : void 0;
      const bounds = sliceBounds(a.dims, starts, ends, axes, steps);
      const dims = bounds.map(([s, e]) => e - s);
      const value = a.value && a.dims.length === 1 ? a.value.slice(bounds[0][0], bounds[0][1]) : void 0;
      return [{ dtype: a.dtype, dims, value }];
    }
    case "Gather": {
      const a = x();
      const indices = need(at2(node.inputs[1]), "Gather indices");
      const axis = normAxis(attrInt(node, "axis", 0), a.dims.length);
      const dims = [...a.dims.slice(0, axis), ...indices.dims, ...a.dims.slice(axis + 1)];
      const value = a.value && indices.value && a.dims.length === 1 ? indices.value.map((i) => a.value[i < 0 ? i + a.dims[0] : i]) : void 0;
      return [{ dtype: a.dtype, dims, value }];
    }
    case "GatherElements":
      return [{ dtype: x().dtype, dims: need(at2(node.inputs[1]), "GatherElements indices").dims }];
    case "ScatterND":
    case "ScatterElements":
      return [{ dtype: x().dtype, dims: x().dims }];
    case "ReduceSum":
    case "ReduceMean":
    case "ReduceMax": {
      const a = x();
      const axes = reduceAxes(node, at2, a.dims.length);
      const keep = attrInt(node, "keepdims", 1) === 1;
      const dims = keep ? a.dims.map((d, i) => axes.includes(i) ? 1 : d) : a.dims.filter((_, i) => !axes.includes(i));
      return [{ dtype: a.dtype, dims }];
    }
    case "Shape": {
      const a = x();
      const start3 = attrInt(node, "start", 0);
      const end = attrInt(node, "end", a.dims.length);
      const [s, e] = sliceRange(a.dims.length, start3, end);
      return [{ dtype: "int64", dims: [e - s], value: a.dims.slice(s, e) }];
    }
    case "Size":
      return [{ dtype: "int64", dims: [], value: [size(x().dims)] }];
    case "ConstantOfShape": {
      const dims = valueOf(x(), "ConstantOfShape shape");
      const a = node.attributes["value"];
      const t = a !== void 0 && a.kind === "tensor" ? a.value : void 0;
      const dtype = t?.dtype ?? "float32";
      const fill = t ? Number(t.data[0]) : 0;
      const value = isInt(dtype) && size(dims) <= MAX_FOLD ? new Array(size(dims)).fill(fill) : void 0;
      return [{ dtype, dims, value }];
    }
    case "Constant": {
      const a = node.attributes["value"];
      if (a === void 0 || a.kind !== "tensor") throw new ShapeInferenceError("Constant without a tensor value");
      return [tensorInfo(a.value)];
    }
    case "Range": {
      const [start3, limit, delta] = [0, 1, 2].map((i) => valueOf(at2(node.inputs[i]), `Range input ${i}`)[0]);
      const n = Math.max(Math.ceil((limit - start3) / delta), 0);
      const dtype = need(at2(node.inputs[0]), "Range start").dtype;
      const value = n <= MAX_FOLD ? Array.from({ length: n }, (_, i) => start3 + i * delta) : void 0;
      return [{ dtype, dims: [n], value }];
    }
    case "Expand": {
      const a = x();
      const target = valueOf(at2(node.inputs[1]), "Expand shape");
      return [{ dtype: a.dtype, dims: broadcast2(a.dims, target) }];
    }
    case "Tile": {
      const a = x();
      const reps = valueOf(at2(node.inputs[1]), "Tile repeats");
      return [{ dtype: a.dtype, dims: a.dims.map((d, i) => d * reps[i]) }];
    }
    case "Pad": {
      const a = x();
      const pads = valueOf(at2(node.inputs[1]), "Pad pads");
      const r = a.dims.length;
      return [{ dtype: a.dtype, dims: a.dims.map((d, i) => d + pads[i] + pads[i + r]) }];
    }
    case "Trilu":
      return [{ dtype: x().dtype, dims: x().dims }];
    case "CumSum":
      return [{ dtype: x().dtype, dims: x().dims }];
    default:
      throw new ShapeInferenceError(`no shape rule for op ${op2}`);
  }
};
var reduceAxes = (node, at2, rank) => {
  const fromInput = node.inputs[1] ? valueOf(at2(node.inputs[1]), `${node.op} axes`) : void 0;
  const axes = fromInput ?? attrInts(node, "axes");
  if (axes === void 0 || axes.length === 0) {
    return attrInt(node, "noop_with_empty_axes", 0) === 1 ? [] : Array.from({ length: rank }, (_, i) => i);
  }
  return axes.map((a) => normAxis(a, rank));
};

// src/autodiff/Backward.ts
var sameDims = (a, b) => a.length === b.length && a.every((d, i) => d === b[i]);
var typedScalar = (value, dtype) => dtype === "float64" ? { dtype, dims: [], data: Float64Array.of(value) } : dtype === "int64" ? { dtype, dims: [], data: BigInt64Array.of(BigInt(value)) } : { dtype: "float32", dims: [], data: Float32Array.of(value) };
var makeEmitter = (graph, shapes) => {
  const cache = /* @__PURE__ */ new Map();
  const cached = (key2, make22) => {
    const hit = cache.get(key2);
    if (hit !== void 0) return hit;
    const name2 = make22();
    cache.set(key2, name2);
    return name2;
  };
  const visitLast = () => shapes.visit(graph.nodes[graph.nodes.length - 1]);
  const op2 = (type, inputs, attributes, domain) => {
    const out = domain === void 0 ? graph.op(type, inputs, attributes) : graph.node(type, inputs, [graph.fresh(type)], attributes ?? {}, domain)[0];
    visitLast();
    return out;
  };
  const opN = (type, inputs, n, attributes) => {
    const outs = graph.opN(type, inputs, n, attributes);
    visitLast();
    return outs;
  };
  const constant2 = (t) => {
    const name2 = graph.constant(t);
    shapes.set(name2, tensorInfo(t));
    return name2;
  };
  const ints2 = (values) => cached(`i:${values.join(",")}`, () => constant2(int64([values.length], values)));
  const scalar = (value, dtype2) => cached(`s:${dtype2}:${value}`, () => constant2(typedScalar(value, dtype2)));
  const dims = (name2) => shapes.get(name2).dims;
  const dtype = (name2) => shapes.get(name2).dtype;
  const zeros = (target, type) => op2("ConstantOfShape", [ints2(target)], { value: tensor({ ...typedScalar(0, type), dims: [1] }) });
  const reduceTo = (grad, target) => {
    const from = dims(grad);
    if (sameDims(from, target)) return grad;
    const pad = from.length - target.length;
    const axes = [];
    for (let i = 0; i < from.length; i++) {
      const t = i < pad ? 1 : target[i - pad];
      if (t === 1 && from[i] !== 1) axes.push(i);
    }
    const summed = axes.length > 0 ? op2("ReduceSum", [grad, ints2(axes)], { keepdims: int2(1) }) : grad;
    return sameDims(dims(summed), target) ? summed : op2("Reshape", [summed, ints2(target)]);
  };
  return { graph, shapes, op: op2, opN, dims, dtype, scalar, ints: ints2, zeros, reduceTo };
};
var swapLast = (e, x) => {
  const r = e.dims(x).length;
  const perm = Array.from({ length: r }, (_, i) => i);
  perm[r - 1] = r - 2;
  perm[r - 2] = r - 1;
  return e.op("Transpose", [x], { perm: ints(perm) });
};
var reshapeTo = (e, g, target) => sameDims(e.dims(g), target) ? g : e.op("Reshape", [g, e.ints(target)]);
var inDims = (e, node, i) => e.dims(node.inputs[i]);
var producer = (e, value) => e.graph.nodes.find((n) => n.outputs.includes(value));
var isSwapLast = (e, x) => {
  const p = producer(e, x);
  const perm = p?.op === "Transpose" && p.attributes["perm"]?.kind === "ints" ? p.attributes["perm"].value : void 0;
  const r = perm?.length ?? 0;
  return perm !== void 0 && r >= 2 && perm.every((d, i) => d === (i === r - 2 ? r - 1 : i === r - 1 ? r - 2 : i));
};
var batchedProduct = (e, a, b, transA, transB) => e.dtype(a) === "float32" ? e.op("FusedMatMul", [a, b], { transA: int2(transA ? 1 : 0), transB: int2(transB ? 1 : 0) }, msDomain) : e.op("MatMul", [transA ? swapLast(e, a) : a, transB ? swapLast(e, b) : b]);
var msDomain = "com.microsoft";
var matMul = (e, node, [g], needs) => {
  const [a, b] = node.inputs;
  const ad = e.dims(a);
  const bd = e.dims(b);
  let ga;
  let gb;
  if (needs[0]) {
    ga = ad.length === 2 && bd.length === 2 ? e.op("Gemm", [g, b], { transB: int2(1) }) : bd.length === 2 ? e.reduceTo(e.op("MatMul", [g, swapLast(e, b)]), ad) : e.reduceTo(batchedProduct(e, g, b, false, true), ad);
  }
  if (needs[1]) {
    if (bd.length === 2) {
      const K = ad.at(-1);
      const N2 = bd.at(-1);
      const a2 = reshapeTo(e, a, [ad.reduce((p, d) => p * d, 1) / K, K]);
      const g2 = reshapeTo(e, g, [e.dims(g).reduce((p, d) => p * d, 1) / N2, N2]);
      gb = e.op("Gemm", [a2, g2], { transA: int2(1) });
    } else if (isSwapLast(e, b)) {
      gb = e.reduceTo(swapLast(e, batchedProduct(e, g, a, true, false)), bd);
    } else {
      gb = e.reduceTo(batchedProduct(e, a, g, true, false), bd);
    }
  }
  return [ga, gb];
};
var attrOr = (node, name2, fallback) => {
  const a = node.attributes[name2];
  return a !== void 0 && (a.kind === "int" || a.kind === "float") ? a.value : fallback;
};
var gemm = (e, node, [g], needs) => {
  const [a, b, c] = node.inputs;
  const alpha = attrOr(node, "alpha", 1);
  const beta = attrOr(node, "beta", 1);
  const transA = attrOr(node, "transA", 0) === 1;
  const transB = attrOr(node, "transB", 0) === 1;
  const flags = (ta, tb) => ({
    alpha: float2(alpha),
    transA: int2(ta ? 1 : 0),
    transB: int2(tb ? 1 : 0)
  });
  const ga = !needs[0] ? void 0 : transA ? e.op("Gemm", [b, g], flags(transB, true)) : e.op("Gemm", [g, b], flags(false, !transB));
  const gb = !needs[1] ? void 0 : transB ? e.op("Gemm", [g, a], flags(true, transA)) : e.op("Gemm", [a, g], flags(!transA, false));
  const gc = needs[2] && c !== void 0 && c !== "" ? e.reduceTo(beta === 1 ? g : e.op("Mul", [g, e.scalar(beta, e.dtype(g))]), e.dims(c)) : void 0;
  return [ga, gb, gc];
};
var elementwise = (f) => (e, node, [g]) => [
  f(e, node, g)
];
var out0 = (node) => node.outputs[0];
var in0 = (node) => node.inputs[0];
var softmax = (e, node, [g]) => {
  const y = out0(node);
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : -1;
  const s = e.op("ReduceSum", [e.op("Mul", [g, y]), e.ints([axis])], { keepdims: int2(1) });
  return [e.op("Mul", [y, e.op("Sub", [g, s])])];
};
var logSoftmax = (e, node, [g]) => {
  const y = out0(node);
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : -1;
  const s = e.op("ReduceSum", [g, e.ints([axis])], { keepdims: int2(1) });
  return [e.op("Sub", [g, e.op("Mul", [e.op("Exp", [y]), s])])];
};
var reduce = (kind) => (e, node, [g]) => {
  const x = in0(node);
  const xd = e.dims(x);
  const axes = reduceAxes(node, (n) => e.shapes.get(n), xd.length);
  const keptDims = xd.map((d, i) => axes.includes(i) ? 1 : d);
  const kept = reshapeTo(e, g, keptDims);
  if (kind === "mean") {
    const count = axes.reduce((p, a) => p * xd[a], 1);
    return [e.op("Expand", [e.op("Mul", [kept, e.scalar(1 / count, e.dtype(x))]), e.ints(xd)])];
  }
  const expanded = e.op("Expand", [kept, e.ints(xd)]);
  if (kind === "sum") return [expanded];
  const max = e.op("Expand", [reshapeTo(e, out0(node), keptDims), e.ints(xd)]);
  return [e.op("Where", [e.op("Equal", [x, max]), expanded, e.scalar(0, e.dtype(x))])];
};
var gather = (e, node, [g], needs) => {
  if (!needs[0]) return [void 0, void 0];
  const [data, indices] = node.inputs;
  const axis = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0;
  if (axis !== 0) throw new ShapeInferenceError("Gather backward supports axis 0 only");
  const dd = e.dims(data);
  const n = e.dims(indices).reduce((p, d) => p * d, 1);
  const idx = reshapeTo(e, indices, [n, 1]);
  const rows = reshapeTo(e, g, [n, ...dd.slice(1)]);
  return [e.op("ScatterND", [e.zeros(dd, e.dtype(data)), idx, rows], { reduction: string2("add") }), void 0];
};
var gatherElements = (e, node, [g], needs) => {
  if (!needs[0]) return [void 0, void 0];
  const [data, indices] = node.inputs;
  return [
    e.op("ScatterElements", [e.zeros(e.dims(data), e.dtype(data)), indices, g], {
      axis: node.attributes["axis"] ?? int2(0),
      reduction: string2("add")
    }),
    void 0
  ];
};
var slice = (e, node, [g]) => {
  const x = in0(node);
  const xd = e.dims(x);
  const v = (i) => node.inputs[i] ? e.shapes.get(node.inputs[i]).value : void 0;
  const bounds = sliceBounds(xd, v(1), v(2), v(3), v(4));
  const pads = [...bounds.map(([s]) => s), ...bounds.map(([, end], i) => xd[i] - end)];
  return [e.op("Pad", [g, e.ints(pads)])];
};
var concat = (e, node, [g], needs) => {
  const rank = e.dims(node.inputs[0]).length;
  const raw = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0;
  const axis = raw < 0 ? raw + rank : raw;
  const sizes = node.inputs.map((n) => e.dims(n)[axis]);
  const parts = e.opN("Split", [g, e.ints(sizes)], sizes.length, { axis: int2(axis) });
  return parts.map((p, i) => needs[i] ? p : void 0);
};
var split = (e, node, grads) => {
  const x = in0(node);
  const rank = e.dims(x).length;
  const raw = node.attributes["axis"]?.kind === "int" ? node.attributes["axis"].value : 0;
  const axis = raw < 0 ? raw + rank : raw;
  const parts = node.outputs.map((o, i) => grads[i] ?? e.zeros(e.dims(o), e.dtype(x)));
  return [e.op("Concat", parts, { axis: int2(axis) })];
};
var where = (e, node, [g], needs) => {
  const [c, a, b] = node.inputs;
  const zero = e.scalar(0, e.dtype(a));
  return [
    void 0,
    needs[1] ? e.reduceTo(e.op("Where", [c, g, zero]), e.dims(a)) : void 0,
    needs[2] ? e.reduceTo(e.op("Where", [c, zero, g]), e.dims(b)) : void 0
  ];
};
var minMax = (pick) => (e, node, [g], needs) => {
  const [a, b] = node.inputs;
  if (node.inputs.length !== 2) throw new ShapeInferenceError(`${pick} backward supports two inputs`);
  const takeA = e.op(pick === "Max" ? "GreaterOrEqual" : "LessOrEqual", [a, b]);
  const zero = e.scalar(0, e.dtype(a));
  return [
    needs[0] ? e.reduceTo(e.op("Where", [takeA, g, zero]), e.dims(a)) : void 0,
    needs[1] ? e.reduceTo(e.op("Where", [takeA, zero, g]), e.dims(b)) : void 0
  ];
};
var clip2 = (e, node, [g]) => {
  const x = in0(node);
  let inside;
  if (node.inputs[1]) inside = e.op("GreaterOrEqual", [x, node.inputs[1]]);
  if (node.inputs[2]) {
    const below = e.op("LessOrEqual", [x, node.inputs[2]]);
    inside = inside === void 0 ? below : e.op("And", [inside, below]);
  }
  return [inside === void 0 ? g : e.op("Where", [inside, g, e.scalar(0, e.dtype(x))])];
};
var binaryRule = (da, db) => (e, node, [g], needs) => {
  const [a, b] = node.inputs;
  const y = out0(node);
  return [
    needs[0] ? e.reduceTo(da(e, a, b, g, y), e.dims(a)) : void 0,
    needs[1] && db !== void 0 ? e.reduceTo(db(e, a, b, g, y), e.dims(b)) : void 0
  ];
};
var plainMul = binaryRule((e, _a, b, g) => e.op("Mul", [g, b]), (e, a, _b, g) => e.op("Mul", [g, a]));
var mul = (e, node, grads, needs) => {
  const [a, b] = node.inputs;
  const silu = [[a, b], [b, a]].find(([x2, s2]) => {
    const p = producer(e, s2);
    return p !== void 0 && p.op === "Sigmoid" && p.inputs[0] === x2 && x2 !== s2;
  });
  if (silu === void 0) return plainMul(e, node, grads, needs);
  const [x, s] = silu;
  if (!needs[node.inputs.indexOf(x)]) return [void 0, void 0];
  const y = out0(node);
  const slope = e.op("Add", [s, e.op("Mul", [y, e.op("Sub", [e.scalar(1, e.dtype(s)), s])])]);
  const gx = e.op("Mul", [grads[0], slope]);
  return node.inputs.map((i) => i === x ? gx : void 0);
};
var rules = {
  Add: binaryRule((_e, _a, _b, g) => g, (_e, _a, _b, g) => g),
  Sub: binaryRule((_e, _a, _b, g) => g, (e, _a, _b, g) => e.op("Neg", [g])),
  Mul: mul,
  Div: binaryRule(
    (e, _a, b, g) => e.op("Div", [g, b]),
    (e, _a, b, g, y) => e.op("Neg", [e.op("Div", [e.op("Mul", [g, y]), b])])
  ),
  Pow: binaryRule((e, a, b, g) => {
    const bm1 = e.op("Sub", [b, e.scalar(1, e.dtype(b))]);
    return e.op("Mul", [g, e.op("Mul", [b, e.op("Pow", [a, bm1])])]);
  }, void 0),
  Sum: (e, node, [g], needs) => node.inputs.map((x, i) => needs[i] ? e.reduceTo(g, e.dims(x)) : void 0),
  Max: minMax("Max"),
  Min: minMax("Min"),
  Neg: elementwise((e, _n, g) => e.op("Neg", [g])),
  Identity: elementwise((_e, _n, g) => g),
  Exp: elementwise((e, n, g) => e.op("Mul", [g, out0(n)])),
  Log: elementwise((e, n, g) => e.op("Div", [g, in0(n)])),
  Sqrt: elementwise((e, n, g) => e.op("Div", [e.op("Mul", [g, e.scalar(0.5, e.dtype(g))]), out0(n)])),
  Reciprocal: elementwise((e, n, g) => e.op("Neg", [e.op("Mul", [g, e.op("Mul", [out0(n), out0(n)])])])),
  Sigmoid: elementwise((e, n, g) => {
    const y = out0(n);
    return e.op("Mul", [g, e.op("Mul", [y, e.op("Sub", [e.scalar(1, e.dtype(y)), y])])]);
  }),
  Tanh: elementwise((e, n, g) => {
    const y = out0(n);
    return e.op("Mul", [g, e.op("Sub", [e.scalar(1, e.dtype(y)), e.op("Mul", [y, y])])]);
  }),
  Relu: elementwise(
    (e, n, g) => e.op("Where", [e.op("Greater", [in0(n), e.scalar(0, e.dtype(g))]), g, e.scalar(0, e.dtype(g))])
  ),
  Abs: elementwise((e, n, g) => e.op("Mul", [g, e.op("Sign", [in0(n)])])),
  Erf: elementwise((e, n, g) => {
    const x = in0(n);
    const t = e.dtype(x);
    const bump2 = e.op("Exp", [e.op("Neg", [e.op("Mul", [x, x])])]);
    return e.op("Mul", [g, e.op("Mul", [bump2, e.scalar(2 / Math.sqrt(Math.PI), t)])]);
  }),
  Cast: elementwise((e, n, g) => {
    const from = e.dtype(in0(n));
    return from === e.dtype(g) ? g : e.op("Cast", [g], { to: int2(dataTypeCode[from]) });
  }),
  Clip: clip2,
  Where: where,
  MatMul: matMul,
  Gemm: gemm,
  Softmax: softmax,
  LogSoftmax: logSoftmax,
  Transpose: (e, node, [g]) => {
    const rank = e.dims(in0(node)).length;
    const perm = node.attributes["perm"]?.kind === "ints" ? node.attributes["perm"].value : Array.from({ length: rank }, (_, i) => rank - 1 - i);
    const inverse = perm.map((_, i) => perm.indexOf(i));
    return [e.op("Transpose", [g], { perm: ints(inverse) })];
  },
  Reshape: (e, node, [g]) => [reshapeTo(e, g, inDims(e, node, 0)), void 0],
  Flatten: (e, node, [g]) => [reshapeTo(e, g, inDims(e, node, 0))],
  Squeeze: (e, node, [g]) => [reshapeTo(e, g, inDims(e, node, 0)), void 0],
  Unsqueeze: (e, node, [g]) => [reshapeTo(e, g, inDims(e, node, 0)), void 0],
  Expand: (e, node, [g]) => [e.reduceTo(g, inDims(e, node, 0)), void 0],
  Concat: concat,
  Split: split,
  Slice: slice,
  Gather: gather,
  GatherElements: gatherElements,
  ReduceSum: reduce("sum"),
  ReduceMean: reduce("mean"),
  ReduceMax: reduce("max")
};

// src/autodiff/LossHead.ts
var inputNames = (config) => [
  "targets",
  "loss_weights",
  "loss_mask",
  ...config.policyLoss === "ppo" ? ["advantages", "old_logprobs"] : [],
  ...config.policyLoss === "ppo" && config.tisCap !== void 0 ? ["sampler_logprobs"] : [],
  ...config.klCoef !== 0 ? ["ref_logprobs"] : []
];
var emit = (e, logits, config, batch, length) => {
  const dtype = e.dtype(logits);
  const vocab = e.dims(logits).at(-1);
  const n = batch * length;
  const c = (x) => e.scalar(x, dtype);
  const declare = (name2, type) => {
    e.graph.input(name2, type, [batch, length]);
    e.shapes.set(name2, { dtype: type, dims: [batch, length] });
    return e.op("Reshape", [name2, e.ints([n])]);
  };
  const data = new Map(inputNames(config).map((name2) => [name2, declare(name2, name2 === "targets" ? "int64" : dtype)]));
  const input = (name2) => data.get(name2);
  const reshaped = e.op("Reshape", [logits, e.ints([n, vocab])]);
  const temperature = config.temperature ?? 1;
  const flat = temperature === 1 ? reshaped : e.op("Div", [reshaped, c(temperature)]);
  const lsm = e.op("LogSoftmax", [flat], { axis: int2(-1) });
  const picked = e.op("GatherElements", [lsm, e.op("Unsqueeze", [input("targets"), e.ints([1])])], {
    axis: int2(1)
  });
  const logprob = e.op("Reshape", [picked, e.ints([n])]);
  const entropy = e.op("Neg", [
    e.op("ReduceSum", [e.op("Mul", [e.op("Exp", [lsm]), lsm]), e.ints([1])], { keepdims: int2(0) })
  ]);
  const mask = input("loss_mask");
  const statTerms = [mask];
  let tokenLoss;
  if (config.policyLoss === "nll") {
    tokenLoss = e.op("Neg", [logprob]);
    statTerms.push(c(0), c(0), c(0));
  } else {
    const advantage = input("advantages");
    const old = input("old_logprobs");
    const negApproxKl = e.op("Clip", [e.op("Sub", [logprob, old]), c(-20), c(20)]);
    const ratio = e.op("Exp", [negApproxKl]);
    const negA = e.op("Neg", [advantage]);
    const loss1 = e.op("Mul", [negA, ratio]);
    const loss2 = e.op("Mul", [negA, e.op("Clip", [ratio, c(1 - config.clipLow), c(1 + config.clipHigh)])]);
    const clippedLoss = e.op("Max", [loss1, loss2]);
    const clipped2 = e.op("Cast", [e.op("Greater", [loss2, loss1])], { to: int2(dataTypeCode[dtype]) });
    let lower = c(0);
    tokenLoss = clippedLoss;
    if (config.dualClip !== void 0) {
      const loss3 = e.op("Mul", [negA, c(config.dualClip)]);
      const negative = e.op("Less", [advantage, c(0)]);
      tokenLoss = e.op("Where", [negative, e.op("Min", [loss3, clippedLoss]), clippedLoss]);
      lower = e.op("Cast", [e.op("And", [negative, e.op("Greater", [clippedLoss, loss3])])], {
        to: int2(dataTypeCode[dtype])
      });
    }
    if (config.tisCap !== void 0) {
      const w = e.op("Min", [e.op("Exp", [e.op("Sub", [old, input("sampler_logprobs")])]), c(config.tisCap)]);
      tokenLoss = e.op("Mul", [tokenLoss, w]);
    }
    statTerms.push(clipped2, lower, e.op("Neg", [negApproxKl]));
  }
  statTerms.push(entropy);
  if (config.klCoef !== 0) {
    const ref = input("ref_logprobs");
    let kl;
    if (config.klEstimator === "k1") {
      kl = e.op("Sub", [logprob, ref]);
    } else {
      const d = e.op("Sub", [ref, logprob]);
      kl = e.op("Clip", [e.op("Sub", [e.op("Sub", [e.op("Exp", [d]), d]), c(1)]), c(-10), c(10)]);
    }
    tokenLoss = e.op("Add", [tokenLoss, e.op("Mul", [kl, c(config.klCoef)])]);
    statTerms.push(kl);
  } else {
    statTerms.push(c(0));
  }
  if (config.entropyCoef !== 0) tokenLoss = e.op("Sub", [tokenLoss, e.op("Mul", [entropy, c(config.entropyCoef)])]);
  const loss = e.op("ReduceSum", [e.op("Mul", [tokenLoss, input("loss_weights")]), e.ints([0])], {
    keepdims: int2(0)
  });
  const sums = statTerms.map(
    (t) => e.op("ReduceSum", [e.op("Mul", [t, mask]), e.ints([0])], { keepdims: int2(1) })
  );
  const stats = e.op("Concat", sums.map((s) => e.dims(s).length === 1 ? s : e.op("Reshape", [s, e.ints([1])])), {
    axis: int2(0)
  });
  const tokenLogprobs = e.op("Reshape", [logprob, e.ints([batch, length])]);
  return { loss, tokenLogprobs, stats, inputs: [...data.keys()] };
};

// src/autodiff/Autodiff.ts
var AutodiffError = class extends Schema18.TaggedError()("AutodiffError", {
  reason: Schema18.Literals(["NoBackwardRule", "ShapeInference", "UnknownValue", "NotDifferentiable"]),
  message: Schema18.String
}) {
};
var Failure = class extends Error {
  reason;
  constructor(reason, message2) {
    super(message2);
    this.reason = reason;
  }
};
var isFloat = (d) => d === "float32" || d === "float64";
var gradientsUnsafe = (e, forwardNodes, loss, wrt) => {
  for (const w of wrt) {
    if (!e.shapes.has(w)) throw new Failure("UnknownValue", `no value named "${w}" in the graph`);
    if (!isFloat(e.dtype(w))) throw new Failure("NotDifferentiable", `"${w}" is ${e.dtype(w)}, not a float tensor`);
  }
  const active = new Set(wrt);
  for (const node of forwardNodes) {
    if (node.inputs.some((i) => active.has(i))) {
      for (const o of node.outputs) if (o !== "" && isFloat(e.dtype(o))) active.add(o);
    }
  }
  if (!active.has(loss)) throw new Failure("NotDifferentiable", `the loss "${loss}" does not depend on any weight`);
  const pending = /* @__PURE__ */ new Map([[loss, [e.scalar(1, e.dtype(loss))]]]);
  const collect = (name2) => {
    const parts = pending.get(name2);
    if (parts === void 0) return void 0;
    if (parts.length === 1) return parts[0];
    const total = e.op("Sum", parts);
    pending.set(name2, [total]);
    return total;
  };
  for (let k = forwardNodes.length - 1; k >= 0; k--) {
    const node = forwardNodes[k];
    const grads = node.outputs.map((o) => o === "" ? void 0 : collect(o));
    if (grads.every((g) => g === void 0)) continue;
    const needs = node.inputs.map((i) => i !== "" && active.has(i));
    if (!needs.some(Boolean)) continue;
    const rule = rules[node.op];
    if (rule === void 0) {
      throw new Failure("NoBackwardRule", `op ${node.op} (output "${node.outputs[0]}") has no backward rule`);
    }
    const shaped = grads.map(
      (g, i) => g === void 0 ? void 0 : e.dims(g).length === e.dims(node.outputs[i]).length ? g : e.op("Expand", [
        g,
        e.ints(e.dims(node.outputs[i]))
      ])
    );
    const inputGrads = rule(e, node, shaped, needs);
    node.inputs.forEach((input, i) => {
      const g = inputGrads[i];
      if (!needs[i] || g === void 0) return;
      const list = pending.get(input);
      if (list === void 0) pending.set(input, [g]);
      else list.push(g);
    });
  }
  const out = /* @__PURE__ */ new Map();
  for (const w of wrt) out.set(w, collect(w) ?? e.zeros(e.dims(w), e.dtype(w)));
  return out;
};
var run2 = (f) => Effect18.try({
  try: f,
  catch: (u) => u instanceof Failure ? new AutodiffError({ reason: u.reason, message: u.message }) : new AutodiffError({ reason: "ShapeInference", message: u instanceof Error ? u.message : String(u) })
});
var declareGradients = (e, grads) => {
  const named = /* @__PURE__ */ new Map();
  for (const [w, g] of grads) {
    const name2 = `grad.${w}`;
    e.graph.node("Identity", [g], [name2]);
    e.graph.output(name2, e.dtype(w), e.dims(w));
    named.set(w, name2);
  }
  return named;
};
var copyGraph = (source, dtype) => {
  const g = make5(`${source.name}_train`);
  const wide = dtype === "float64";
  const t = (d) => wide && d === "float32" ? "float64" : d;
  const tensor2 = (x) => wide && x.dtype === "float32" ? { dtype: "float64", dims: x.dims, data: Float64Array.from(x.data) } : x;
  for (const i of source.inputs) g.input(i.name, t(i.dtype), i.shape);
  for (const [name2, x] of source.initializers) g.initializer(name2, tensor2(x));
  for (const n of source.nodes) {
    const attributes = {};
    for (const [k, a] of Object.entries(n.attributes)) {
      attributes[k] = !wide ? a : a.kind === "tensor" ? tensor(tensor2(a.value)) : n.op === "Cast" && k === "to" && a.kind === "int" && a.value === dataTypeCode.float32 ? int2(dataTypeCode.float64) : a;
    }
    g.node(n.op, n.inputs, n.outputs, attributes, n.domain);
  }
  return g;
};
var trainingGraph = (forward, options) => run2(() => {
  const dtype = options.dtype ?? "float32";
  const graph = copyGraph(forward.graph, dtype);
  const shapes = make9(graph, { ...options.dims, batch: options.batch, seq: options.length });
  const forwardNodes = [...graph.nodes];
  const e = makeEmitter(graph, shapes);
  const head = emit(e, forward.logits, options.loss, options.batch, options.length);
  const lossNodes = graph.nodes.slice(forwardNodes.length);
  const named = options.withGradients === false ? /* @__PURE__ */ new Map() : declareGradients(e, gradientsUnsafe(e, [...forwardNodes, ...lossNodes], head.loss, forward.weightInputs));
  const out = { loss: "loss", tokenLogprobs: "token_logprobs", stats: "stats" };
  graph.node("Identity", [head.loss], [out.loss]);
  graph.output(out.loss, dtype, []);
  graph.node("Identity", [head.tokenLogprobs], [out.tokenLogprobs]);
  graph.output(out.tokenLogprobs, dtype, [options.batch, options.length]);
  graph.node("Identity", [head.stats], [out.stats]);
  graph.output(out.stats, dtype, [6]);
  const weightSet = new Set(forward.weightInputs);
  return {
    graph,
    batch: options.batch,
    length: options.length,
    weights: forward.weightInputs.map((name2) => ({ name: name2, dims: shapes.get(name2).dims })),
    modelInputs: forward.graph.inputs.map((i) => i.name).filter((n) => !weightSet.has(n)),
    lossInputs: head.inputs,
    gradients: named,
    outputs: out
  };
});

// src/Checkpoint.ts
import { Effect as Effect20, FileSystem as FileSystem6, Schema as Schema19 } from "effect";

// src/internal/diskFull.ts
import { Effect as Effect19, PlatformError } from "effect";
var codes = /* @__PURE__ */ new Set(["ENOSPC", "EDQUOT"]);
var isDiskFull = (e, depth = 0) => {
  if (typeof e !== "object" || e === null || depth > 6) return false;
  const u = e;
  if (typeof u.code === "string" && codes.has(u.code)) return true;
  if (u.reason === "DiskFull") return true;
  if (typeof u.message === "string" && /\bENOSPC\b|\bEDQUOT\b|no space left on device/.test(u.message)) return true;
  return isDiskFull(u.cause, depth + 1) || typeof u.reason === "object" && isDiskFull(u.reason, depth + 1);
};
var marker = "disk full (ENOSPC)";

// src/Checkpoint.ts
var StateFile = Schema19.Struct({
  format: Schema19.Literal("agentfly-checkpoint/1"),
  step: Schema19.Int,
  policyVersion: Schema19.Int,
  rngState: Schema19.Array(Schema19.Number),
  weights: Schema19.Array(Schema19.String),
  /** Absent in checkpoints written before it was added. */
  weightsHash: Schema19.optionalKey(Schema19.String)
});
var decodeStateFile = Schema19.decodeUnknownEffect(Schema19.fromJsonString(StateFile));
var CheckpointError = class extends Schema19.TaggedError()("CheckpointError", {
  reason: Schema19.Literals(["NotFound", "Incomplete", "Corrupt", "Mismatch", "NonFinite", "DiskFull", "Io"]),
  path: Schema19.String,
  message: Schema19.String
}) {
};
var io = (path) => (e) => isDiskFull(e) ? new CheckpointError({
  reason: "DiskFull",
  path,
  message: `${marker}: could not write ${path}; free space on its filesystem, then resume`
}) : new CheckpointError({ reason: "Io", path, message: e.message });
var fingerprint = (weights) => {
  let h1 = 2166136261;
  let h2 = 16777619;
  for (const name2 of [...weights.keys()].sort()) {
    const w = weights.get(name2);
    const bytes2 = new Uint8Array(w.buffer, w.byteOffset, w.byteLength);
    for (let i = 0; i < bytes2.length; i++) {
      h1 = Math.imul(h1 ^ bytes2[i], 16777619);
      h2 = Math.imul(h2 ^ bytes2[i], 1540483477);
    }
  }
  return (h1 >>> 0).toString(16).padStart(8, "0") + (h2 >>> 0).toString(16).padStart(8, "0");
};
var firstNonFinite = (tensors) => {
  for (const [name2, data] of tensors) {
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i])) return `${name2}[${i}] = ${data[i]}`;
    }
  }
  return void 0;
};
var save = Effect20.fn("Checkpoint.save")(function* (dir, state) {
  const fs = yield* FileSystem6.FileSystem;
  const bad = firstNonFinite(state.weights.map((w) => [w.name, w.data])) ?? firstNonFinite(state.optimizer.m) ?? firstNonFinite(state.optimizer.v);
  if (bad !== void 0) {
    return yield* new CheckpointError({ reason: "NonFinite", path: dir, message: `not saved: ${bad} is not finite` });
  }
  yield* fs.makeDirectory(dir, { recursive: true }).pipe(Effect20.mapError(io(dir)));
  const statePath = `${dir}/trainer_state.json`;
  if (yield* fs.exists(statePath).pipe(Effect20.mapError(io(statePath)))) {
    yield* fs.remove(statePath).pipe(Effect20.mapError(io(statePath)));
  }
  const model = serialize(state.weights, { format: "pt" });
  const moments = state.weights.flatMap((w) => [
    { name: `m.${w.name}`, shape: w.shape, data: state.optimizer.m.get(w.name) },
    { name: `v.${w.name}`, shape: w.shape, data: state.optimizer.v.get(w.name) }
  ]);
  yield* fs.writeFile(`${dir}/model.safetensors`, model).pipe(Effect20.mapError(io(`${dir}/model.safetensors`)));
  yield* fs.writeFile(`${dir}/optimizer.safetensors`, serialize(moments)).pipe(
    Effect20.mapError(io(`${dir}/optimizer.safetensors`))
  );
  const json = JSON.stringify({
    format: "agentfly-checkpoint/1",
    step: state.optimizer.step,
    policyVersion: state.policyVersion,
    rngState: state.rngState,
    weights: state.weights.map((w) => w.name),
    weightsHash: fingerprint(new Map(state.weights.map((w) => [w.name, w.data])))
  });
  yield* fs.writeFileString(`${statePath}.tmp`, json).pipe(Effect20.mapError(io(statePath)));
  yield* fs.rename(`${statePath}.tmp`, statePath).pipe(Effect20.mapError(io(statePath)));
});
var readTensors = Effect20.fnUntraced(function* (fs, path, expected) {
  if (!(yield* fs.exists(path).pipe(Effect20.mapError(io(path))))) {
    return yield* new CheckpointError({ reason: "Incomplete", path, message: `${path} is missing` });
  }
  const bytes2 = yield* fs.readFile(path).pipe(Effect20.mapError(io(path)));
  const file = yield* parse2(bytes2, path).pipe(
    Effect20.mapError((e) => new CheckpointError({ reason: "Corrupt", path, message: e.message }))
  );
  const out = /* @__PURE__ */ new Map();
  for (const { name: name2, shape } of expected) {
    const t = file.tensors.get(name2);
    if (t === void 0) {
      return yield* new CheckpointError({ reason: "Mismatch", path, message: `tensor ${name2} is missing` });
    }
    if (t.dtype !== "F32" || t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      return yield* new CheckpointError({
        reason: "Mismatch",
        path,
        message: `tensor ${name2}: ${t.dtype} [${t.shape}] where F32 [${shape}] is expected`
      });
    }
    const data = new Float32Array(t.bytes.byteLength / 4);
    new Uint8Array(data.buffer).set(t.bytes);
    out.set(name2, data);
  }
  if (file.tensors.size !== expected.length) {
    const extra = [...file.tensors.keys()].filter((k) => !expected.some((e) => e.name === k));
    return yield* new CheckpointError({ reason: "Mismatch", path, message: `unexpected tensors: ${extra.join(", ")}` });
  }
  return out;
});
var load4 = Effect20.fn("Checkpoint.load")(function* (dir, expected) {
  const fs = yield* FileSystem6.FileSystem;
  if (!(yield* fs.exists(dir).pipe(Effect20.mapError(io(dir))))) {
    return yield* new CheckpointError({ reason: "NotFound", path: dir, message: `no checkpoint at ${dir}` });
  }
  const statePath = `${dir}/trainer_state.json`;
  if (!(yield* fs.exists(statePath).pipe(Effect20.mapError(io(statePath))))) {
    return yield* new CheckpointError({ reason: "Incomplete", path: statePath, message: `${statePath} is missing` });
  }
  const text4 = yield* fs.readFileString(statePath).pipe(Effect20.mapError(io(statePath)));
  const meta = yield* decodeStateFile(text4).pipe(
    Effect20.mapError((e) => new CheckpointError({ reason: "Corrupt", path: statePath, message: e.message }))
  );
  const modelPath = `${dir}/model.safetensors`;
  const weights = yield* readTensors(fs, modelPath, expected);
  const moments = yield* readTensors(
    fs,
    `${dir}/optimizer.safetensors`,
    expected.flatMap((e) => [{ name: `m.${e.name}`, shape: e.shape }, { name: `v.${e.name}`, shape: e.shape }])
  );
  const bad = firstNonFinite(weights) ?? firstNonFinite(moments);
  if (bad !== void 0) {
    return yield* new CheckpointError({ reason: "NonFinite", path: dir, message: `${dir}: ${bad} is not finite` });
  }
  const hash = fingerprint(weights);
  if (meta.weightsHash !== void 0 && meta.weightsHash !== hash) {
    return yield* new CheckpointError({
      reason: "Corrupt",
      path: modelPath,
      message: `${modelPath} does not hold the weights saved (fingerprint ${hash}, saved ${meta.weightsHash})`
    });
  }
  const optimizer = {
    step: meta.step,
    m: new Map(expected.map((e) => [e.name, moments.get(`m.${e.name}`)])),
    v: new Map(expected.map((e) => [e.name, moments.get(`v.${e.name}`)]))
  };
  return { weights, optimizer, policyVersion: meta.policyVersion, rngState: meta.rngState, weightsHash: hash };
});

// src/Loss.ts
import { Schema as Schema20 } from "effect";
var AggregationMode = Schema20.Literals([
  "token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum-norm"
]);
var KlEstimator = Schema20.Literals(["k1", "k3"]);
var Config = Schema20.Struct({
  /** `nll` for SFT, `ppo` for every policy-gradient method (vanilla PG is PPO with one update per batch). */
  policyLoss: Schema20.Literals(["nll", "ppo"]),
  aggregation: AggregationMode,
  /** ε_low of the clip range (`ppo`). */
  clipLow: Schema20.Number,
  /** ε_high of the clip range (`ppo`; DAPO's clip-higher uses 0.28). */
  clipHigh: Schema20.Number,
  /** Dual-clip bound `c > 1` for negative advantages; absent = off. */
  dualClip: Schema20.optionalKey(Schema20.Number),
  /** Cap of the truncated importance weights old/sampler; absent = off. */
  tisCap: Schema20.optionalKey(Schema20.Number),
  /** Coefficient of the KL-to-reference loss term; 0 = off. */
  klCoef: Schema20.Number,
  klEstimator: KlEstimator,
  /** Coefficient of the entropy bonus; 0 = off. */
  entropyCoef: Schema20.Number,
  /** The constant length of `seq-mean-token-sum-norm`; defaults to the padded row length. */
  normLength: Schema20.optionalKey(Schema20.Number),
  /**
   * The sampling temperature of the rollouts: logprobs (and so the ratio, entropy and KL) are those of
   * `softmax(logits / temperature)`, the distribution the sampler drew from and reported. Absent = 1.
   */
  temperature: Schema20.optionalKey(Schema20.Number)
});
var sft = {
  policyLoss: "nll",
  aggregation: "token-mean",
  clipLow: 0.2,
  clipHigh: 0.2,
  klCoef: 0,
  klEstimator: "k3",
  entropyCoef: 0
};
var grpo2 = { ...sft, policyLoss: "ppo", aggregation: "seq-mean-token-mean" };
var drGrpo = { ...sft, policyLoss: "ppo", aggregation: "seq-mean-token-sum-norm" };
var ppo = { ...sft, policyLoss: "ppo", aggregation: "token-mean", dualClip: 3 };

// src/LrSchedule.ts
import { Schema as Schema21 } from "effect";
var Config2 = Schema21.Struct({
  kind: Schema21.Literals(["constant", "cosine"]),
  lr: Schema21.Number,
  warmupSteps: Schema21.Int,
  /** Required for `cosine`. */
  totalSteps: Schema21.optionalKey(Schema21.Int),
  minLr: Schema21.optionalKey(Schema21.Number)
});
var constant = (lr, warmupSteps = 0) => ({ kind: "constant", lr, warmupSteps });
var at = (config, step3) => {
  if (step3 < config.warmupSteps) return config.lr * (step3 + 1) / config.warmupSteps;
  if (config.kind === "constant") return config.lr;
  const minLr = config.minLr ?? 0;
  const total = config.totalSteps ?? config.warmupSteps;
  const span = total - config.warmupSteps;
  if (span <= 0 || step3 >= total) return minLr;
  const progress = (step3 - config.warmupSteps) / span;
  return minLr + 0.5 * (config.lr - minLr) * (1 + Math.cos(Math.PI * progress));
};

// src/backends/OnnxTrainer.ts
import { Effect as Effect23, FileSystem as FileSystem7, Layer as Layer6, Scope, Semaphore } from "effect";
import * as ort from "onnxruntime-node";

// src/Optimizer.ts
import { Schema as Schema22 } from "effect";

// src/internal/adamKernel.ts
var CHUNK = 16384;
var leb = (n) => {
  const out = [];
  do {
    let byte = n & 127;
    n >>>= 7;
    if (n !== 0) byte |= 128;
    out.push(byte);
  } while (n !== 0);
  return out;
};
var section = (id, body2) => [id, ...leb(body2.length), ...body2];
var vec = (items) => [...leb(items.length), ...items.flat()];
var name = (s) => [...leb(s.length), ...Array.from(s, (ch) => ch.charCodeAt(0))];
var I32 = 127;
var F64 = 124;
var V128 = 123;
var get = (i) => [32, ...leb(i)];
var set = (i) => [33, ...leb(i)];
var simd = (op2) => [253, ...leb(op2)];
var memarg = [3, 0];
var op = {
  load64Zero: [...simd(93), ...memarg],
  store64Lane0: [...simd(91), ...memarg, 0],
  promote: simd(95),
  demote: simd(94),
  splat: simd(20),
  sqrt: simd(239),
  add: simd(240),
  sub: simd(241),
  mul: simd(242),
  div: simd(243)
};
var P = 0;
var G = 1;
var M = 2;
var Vv = 3;
var N = 4;
var I = 14;
var END = 15;
var S = 16;
var GI = 25;
var MI = 26;
var VI = 27;
var splatted = (k) => get(S + k);
var lanes = (base) => [...get(base), ...get(I), 106, ...op.load64Zero, ...op.promote];
var storeTo = (base, value) => [
  ...get(base),
  ...get(I),
  106,
  ...value,
  ...op.demote,
  ...op.store64Lane0
];
var body = [
  ...Array.from({ length: 9 }, (_, k) => [...get(5 + k), ...op.splat, ...set(S + k)]).flat(),
  ...get(N),
  65,
  4,
  108,
  ...set(END),
  // end = n · 4
  65,
  0,
  ...set(I),
  2,
  64,
  3,
  64,
  // block, loop
  ...get(I),
  ...get(END),
  79,
  13,
  1,
  // i ≥ end: break
  // gi = g · scale
  ...lanes(G),
  ...splatted(0),
  ...op.mul,
  ...set(GI),
  // mi = beta1 · m + b1c · gi
  ...splatted(1),
  ...lanes(M),
  ...op.mul,
  ...splatted(2),
  ...get(GI),
  ...op.mul,
  ...op.add,
  ...set(MI),
  // vi = beta2 · v + (b2c · gi) · gi
  ...splatted(3),
  ...lanes(Vv),
  ...op.mul,
  ...splatted(4),
  ...get(GI),
  ...op.mul,
  ...get(GI),
  ...op.mul,
  ...op.add,
  ...set(VI),
  ...storeTo(M, get(MI)),
  ...storeTo(Vv, get(VI)),
  // p = p · keep − (stepSize · mi) / (√vi · invSqrtC2 + eps)
  ...storeTo(P, [
    ...lanes(P),
    ...splatted(8),
    ...op.mul,
    ...splatted(5),
    ...get(MI),
    ...op.mul,
    ...get(VI),
    ...op.sqrt,
    ...splatted(6),
    ...op.mul,
    ...splatted(7),
    ...op.add,
    ...op.div,
    ...op.sub
  ]),
  ...get(I),
  65,
  8,
  106,
  ...set(I),
  // two floats per iteration
  12,
  0,
  11,
  11,
  // br loop; end loop; end block
  11
];
var moduleBytes = () => {
  const params = [I32, I32, I32, I32, I32, ...Array.from({ length: 9 }, () => F64)];
  const locals = vec([[2, I32], [12, V128]]);
  const code = [...locals, ...body];
  return Uint8Array.from([
    0,
    97,
    115,
    109,
    1,
    0,
    0,
    0,
    ...section(1, vec([[96, ...vec(params.map((t) => [t])), 0]])),
    ...section(3, vec([[0]])),
    ...section(5, vec([[0, CHUNK * 16 / 65536 + 1]])),
    ...section(7, vec([[...name("adam"), 0, 0], [...name("memory"), 2, 0]])),
    ...section(10, vec([[...leb(code.length), ...code]]))
  ]);
};
var make10 = () => {
  const bytes2 = moduleBytes();
  if (typeof WebAssembly === "undefined" || !WebAssembly.validate(bytes2)) return void 0;
  const instance = new WebAssembly.Instance(new WebAssembly.Module(bytes2));
  const adam = instance.exports["adam"];
  const memory = instance.exports["memory"];
  const view = new Float32Array(memory.buffer, 0, CHUNK * 4);
  const [pAt, gAt, mAt, vAt] = [0, 1, 2, 3].map((k) => k * CHUNK);
  return (p, g, m, v, c) => {
    for (let start3 = 0; start3 < p.length; start3 += CHUNK) {
      const end = Math.min(start3 + CHUNK, p.length);
      const n = end - start3;
      view.set(p.subarray(start3, end), pAt);
      view.set(g.subarray(start3, end), gAt);
      view.set(m.subarray(start3, end), mAt);
      view.set(v.subarray(start3, end), vAt);
      adam(
        pAt * 4,
        gAt * 4,
        mAt * 4,
        vAt * 4,
        n + (n & 1),
        c.scale,
        c.beta1,
        1 - c.beta1,
        c.beta2,
        1 - c.beta2,
        c.stepSize,
        c.invSqrtC2,
        c.eps,
        c.keep
      );
      p.set(view.subarray(pAt, pAt + n), start3);
      m.set(view.subarray(mAt, mAt + n), start3);
      v.set(view.subarray(vAt, vAt + n), start3);
    }
  };
};

// src/internal/adamStep.ts
var defaultNoDecay = (name2) => /norm|bias/.test(name2);
var step = (params, grads, state, lr, config, gradScale = 1, noDecay = defaultNoDecay) => {
  const t = state.step + 1;
  const { beta1, beta2, eps } = config;
  const c1 = 1 - beta1 ** t;
  const c2 = 1 - beta2 ** t;
  for (const [name2, p] of params) {
    const g = grads.get(name2);
    if (g === void 0) continue;
    const m = state.m.get(name2);
    const v = state.v.get(name2);
    const decay = noDecay(name2) ? 0 : lr * config.weightDecay;
    if (kernel === void 0) updateTensor(p, g, m, v, gradScale, beta1, beta2, lr / c1, 1 / Math.sqrt(c2), eps, decay);
    else {
      kernel(p, g, m, v, {
        scale: gradScale,
        beta1,
        beta2,
        stepSize: lr / c1,
        invSqrtC2: 1 / Math.sqrt(c2),
        eps,
        keep: 1 - decay
      });
    }
  }
  state.step = t;
  return t;
};
var kernel = make10();
var updateTensor = (p, g, m, v, scale, beta1, beta2, stepSize, invSqrtC2, eps, decay) => {
  const b1c = 1 - beta1;
  const b2c = 1 - beta2;
  for (let i = 0; i < p.length; i++) {
    const gi = g[i] * scale;
    const mi = beta1 * m[i] + b1c * gi;
    const vi = beta2 * v[i] + b2c * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const pi = p[i] * (1 - decay);
    p[i] = pi - stepSize * mi / (Math.sqrt(vi) * invSqrtC2 + eps);
  }
};

// src/Optimizer.ts
var Config3 = Schema22.Struct({
  beta1: Schema22.Number,
  beta2: Schema22.Number,
  eps: Schema22.Number,
  weightDecay: Schema22.Number,
  /** Global L2 gradient-norm clip; absent = no clipping. */
  maxGradNorm: Schema22.optionalKey(Schema22.Number)
});
var defaultConfig = { beta1: 0.9, beta2: 0.98, eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };
var makeState = (params) => {
  const m = /* @__PURE__ */ new Map();
  const v = /* @__PURE__ */ new Map();
  for (const [name2, p] of params) {
    m.set(name2, new Float32Array(p.length));
    v.set(name2, new Float32Array(p.length));
  }
  return { step: 0, m, v };
};
var globalNorm = (grads) => {
  let sq = 0;
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) sq += g[i] * g[i];
  return Math.sqrt(sq);
};
var clipScale = (norm, maxNorm) => {
  if (!Number.isFinite(norm)) return 0;
  if (maxNorm === void 0 || norm <= maxNorm) return 1;
  return maxNorm / (norm + 1e-6);
};
var step2 = step;

// src/PolicyTrainer.ts
import { Context as Context6, Effect as Effect21, Layer as Layer5, Ref as Ref2, Schema as Schema23 } from "effect";
var PolicyTrainerErrorReason = Schema23.Literals([
  "BadBatch",
  // the micro-batch is malformed (array sizes, token ids outside the vocabulary)
  "Graph",
  // the training graph could not be built (autodiff)
  "Session",
  // onnxruntime could not create a session (e.g. the execution provider is missing)
  "Run",
  // onnxruntime failed while running
  "NonFiniteGradient",
  // NaN/Inf gradients: the update was skipped and the accumulators cleared
  "NothingAccumulated",
  // optimStep without a forwardBackward since the last step
  "Checkpoint"
  // saving or loading failed
]);
var PolicyTrainerError = class extends Schema23.TaggedError()("PolicyTrainerError", {
  reason: PolicyTrainerErrorReason,
  message: Schema23.String
}) {
  /** A skipped non-finite step can be retried with the next batch; the others need a fix. */
  get isRetryable() {
    return this.reason === "NonFiniteGradient";
  }
};
var PolicyTrainer = class extends Context6.Service()("agentfly/src/PolicyTrainer") {
};
var RecordingRef = class extends Context6.Service()("agentfly/src/PolicyTrainer/Recording") {
};

// src/backends/internal/trainerPool.ts
import { Effect as Effect22, Result } from "effect";
import { Worker } from "node:worker_threads";
var workerUrl = new URL("./trainerWorker.mjs", import.meta.url);
var fail = (reason, message2) => new PolicyTrainerError({ reason, message: message2 });
var spawn = (init2) => Effect22.try({
  try: () => new Worker(workerUrl, { workerData: init2 }),
  catch: (u) => fail("Session", `worker ${init2.index} could not start: ${u instanceof Error ? u.message : u}`)
}).pipe(Effect22.flatMap(
  (worker) => Effect22.callback((resume) => {
    const off = () => {
      worker.off("message", onReady);
      worker.off("error", onError);
      worker.off("exit", onExit);
    };
    const onReady = () => {
      off();
      resume(Effect22.succeed(worker));
    };
    const onError = (e) => {
      off();
      resume(Effect22.fail(fail("Session", `worker ${init2.index} failed to start: ${e.message}`)));
    };
    const onExit = (code) => {
      off();
      resume(Effect22.fail(fail("Session", `worker ${init2.index} exited with code ${code} while starting`)));
    };
    worker.once("message", onReady);
    worker.once("error", onError);
    worker.once("exit", onExit);
    return Effect22.promise(() => worker.terminate());
  })
));
var start2 = (inits, onExit = () => {
}) => Effect22.gen(function* () {
  const started = yield* Effect22.forEach(inits, (init2) => Effect22.result(spawn(init2)), { concurrency: "unbounded" });
  const workers = started.filter(Result.isSuccess).map((r) => r.success);
  const failed = started.find(Result.isFailure);
  if (failed !== void 0) {
    yield* Effect22.forEach(workers, (w) => Effect22.promise(() => w.terminate()), { discard: true });
    return yield* failed.failure;
  }
  const waiting = /* @__PURE__ */ new Map();
  let nextId = 1;
  let broken;
  let closing = false;
  const exited = workers.map(() => false);
  const failWaiting = (index2, message2) => {
    if (!closing) broken ??= message2;
    for (const [id, w] of waiting) {
      if (w.index !== index2) continue;
      waiting.delete(id);
      w.resume(Effect22.fail(fail("Run", message2)));
    }
  };
  workers.forEach((worker, index2) => {
    worker.on("message", (reply) => {
      const w = waiting.get(reply.id);
      if (w === void 0) return;
      waiting.delete(reply.id);
      w.resume(
        reply.ok ? Effect22.succeed(reply.output) : Effect22.fail(fail(reply.reason, `worker ${index2}: ${reply.message}`))
      );
    });
    worker.on("error", (e) => failWaiting(index2, `worker ${index2} crashed: ${e.message}`));
    worker.on("exit", (code) => {
      exited[index2] = true;
      onExit();
      failWaiting(index2, `worker ${index2} exited with code ${code}`);
    });
  });
  const request = (index2, req) => Effect22.callback((resume) => {
    if (broken !== void 0 || exited[index2]) {
      return resume(Effect22.fail(fail("Run", broken ?? `worker ${index2} has exited`)));
    }
    const id = nextId++;
    waiting.set(id, { index: index2, resume });
    workers[index2].postMessage({ ...req, id });
    return Effect22.sync(() => waiting.delete(id));
  });
  const end = (index2, op2) => exited[index2] ? Effect22.void : Effect22.callback((resume) => {
    workers[index2].once("exit", () => resume(Effect22.void));
    workers[index2].postMessage({ op: op2, id: 0 });
  });
  return {
    size: workers.length,
    request,
    broken: () => broken,
    kill: (index2) => end(index2, "crash"),
    // A thread still busy after `wait` is unreferenced (it no longer keeps the process alive) and ends when its
    // step does.
    close: (wait) => Effect22.suspend(() => {
      closing = true;
      return Effect22.forEach(workers, (worker, index2) => end(index2, "close").pipe(
        Effect22.timeoutOrElse({ duration: wait, orElse: () => Effect22.sync(() => worker.unref()) })
      ), { concurrency: "unbounded", discard: true });
    })
  };
});

// src/backends/OnnxTrainer.ts
var littleEndian = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1;
var int64s = (values) => {
  if (!littleEndian) return BigInt64Array.from(Array.from(values), (v) => BigInt(v));
  const out = new BigInt64Array(values.length);
  const words2 = new Int32Array(out.buffer);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    words2[2 * i] = v;
    words2[2 * i + 1] = v >> 31;
  }
  return out;
};
var fail2 = (reason, message2) => new PolicyTrainerError({ reason, message: message2 });
var errorMessage = (u) => u instanceof Error ? u.message : String(u);
var shardRanges = (rows, workers) => {
  const k = Math.max(1, Math.min(workers, rows));
  const base = Math.floor(rows / k);
  const extra = rows % k;
  const out = [];
  for (let i = 0, start3 = 0; i < k; i++) {
    const end = start3 + base + (i < extra ? 1 : 0);
    out.push([start3, end]);
    start3 = end;
  }
  return out;
};
var shardOf = (mb, r0, r1) => {
  const from = r0 * mb.length;
  const to = r1 * mb.length;
  const mask = mb.mask.slice(from, to);
  return {
    batch: r1 - r0,
    length: mb.length,
    inputIds: mb.inputIds.slice(from, to),
    attentionMask: mb.attentionMask.slice(from, to),
    targets: mb.targets.slice(from, to),
    mask,
    weights: mb.weights.slice(from, to),
    advantages: mb.advantages.slice(from, to),
    samplerLogprobs: mb.samplerLogprobs.slice(from, to),
    refLogprobs: mb.refLogprobs.slice(from, to),
    oldLogprobs: mb.oldLogprobs?.slice(from, to),
    sequenceIndex: mb.sequenceIndex.slice(r0, r1),
    lossTokens: mask.reduce((n, m) => n + (m !== 0 ? 1 : 0), 0)
  };
};
var combine2 = (mb, shards, results) => {
  const tokenLogprobs = new Float32Array(mb.batch * mb.length);
  const stats = [0, 0, 0, 0, 0, 0];
  let loss = 0;
  results.forEach((r, j) => {
    loss += r.loss;
    for (let k = 0; k < 6; k++) stats[k] += r.stats[k];
    tokenLogprobs.set(r.tokenLogprobs, shards[j][0] * mb.length);
  });
  const [tokens, clipped2, clippedLower, approxKl, entropy, kl] = stats;
  return { loss, tokenLogprobs, tokens, clipped: clipped2, clippedLower, approxKl, entropy, kl };
};
var toFeed = (t) => t.type === "int64" ? { type: "int64", data: t.data, dims: t.dims } : { type: "float32", data: t.data, dims: t.dims };
var layoutOf = (parameters2) => {
  const lengths = parameters2.map((p) => p.shape.reduce((a, b) => a * b, 1));
  const offsets = lengths.map((_, i) => lengths.slice(0, i).reduce((a, b) => a + b, 0));
  return { names: parameters2.map((p) => p.name), offsets, lengths, total: lengths.reduce((a, b) => a + b, 0) };
};
var sharedViews = (buffer, layout) => new Map(layout.names.map((name2, i) => [name2, new Float32Array(buffer, layout.offsets[i] * 4, layout.lengths[i])]));
var make11 = Effect23.fn("OnnxTrainer.make")(function* (options) {
  const { model } = options;
  const workers = options.workers ?? 1;
  if (!(Number.isInteger(workers) && workers >= 1)) {
    return yield* fail2("Session", `workers must be a positive integer, got ${workers}`);
  }
  const layout = layoutOf(model.parameters);
  const shared = workers > 1 ? {
    params: new SharedArrayBuffer(layout.total * 4),
    m: new SharedArrayBuffer(layout.total * 4),
    v: new SharedArrayBuffer(layout.total * 4),
    accum: new SharedArrayBuffer(layout.total * 4),
    grads: Array.from({ length: workers }, () => new SharedArrayBuffer(layout.total * 4))
  } : void 0;
  const sharedParams = shared === void 0 ? void 0 : sharedViews(shared.params, layout);
  const params = /* @__PURE__ */ new Map();
  for (const { name: name2, shape } of model.parameters) {
    const w = options.weights.get(name2);
    const n = shape.reduce((a, b) => a * b, 1);
    if (w === void 0 || w.length !== n) {
      return yield* fail2("BadBatch", `weight ${name2}: expected ${n} floats [${shape}], got ${w?.length ?? "none"}`);
    }
    const p = sharedParams?.get(name2);
    params.set(name2, p === void 0 ? Float32Array.from(w) : (p.set(w), p));
  }
  let state = shared === void 0 ? makeState(params) : { step: 0, m: sharedViews(shared.m, layout), v: sharedViews(shared.v, layout) };
  const accum = shared === void 0 ? new Map([...params].map(([k, v]) => [k, new Float32Array(v.length)])) : sharedViews(shared.accum, layout);
  let accumulated = 0;
  const sessions = /* @__PURE__ */ new Map();
  const lock = yield* Semaphore.make(1);
  const scope = yield* Effect23.scope;
  const fs = yield* FileSystem7.FileSystem;
  const sessionOptions = {
    executionProviders: [options.executionProvider ?? "cpu"],
    intraOpNumThreads: options.intraOpThreads ?? (workers > 1 ? 1 : 2),
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
    // onnxruntime's CPU arena keeps each session's largest working set (its activations and gradients, ≈ 100 MB
    // per worker and shape for the tiny preset at 4,096 tokens) for the session's lifetime, and a trainer keeps up
    // to `maxSessions` shapes per worker: 3.0 GB of RSS on the calculator demo's RL phase. Without it the tensors go
    // back to malloc after each run. The memory pattern goes with the arena: without one it allocates each run's
    // whole plan as one fresh block, mapped and faulted in anew every run (steps 1.45× slower); tensor by tensor,
    // malloc reuses the memory of the run before (1.04–1.09×, see BENCHMARKS.md).
    enableCpuMemArena: options.memoryArena === true,
    enableMemPattern: options.memoryArena === true,
    extra: { session: { intra_op: { allow_spinning: options.allowSpinning === true ? "1" : "0" } } }
  };
  const release = (c) => Effect23.suspend(() => {
    if (c.released) return Effect23.void;
    c.released = true;
    return Effect23.tryPromise(() => c.session.release()).pipe(Effect23.ignore);
  });
  const buildGraph = (batch, length, withGradients) => trainingGraph(model.forward(), { batch, length, loss: options.loss, withGradients }).pipe(Effect23.mapError((e) => fail2("Graph", e.message)));
  const compile2 = Effect23.fnUntraced(function* (batch, length, withGradients) {
    const key2 = `${withGradients ? "train" : "fwd"}:${batch}x${length}`;
    const hit = sessions.get(key2);
    if (hit !== void 0) {
      sessions.delete(key2);
      sessions.set(key2, hit);
      return hit;
    }
    const graph = yield* buildGraph(batch, length, withGradients);
    const bytes2 = toModelBytes(graph.graph);
    const session = yield* Effect23.tryPromise({
      try: () => ort.InferenceSession.create(bytes2, sessionOptions),
      catch: (u) => fail2("Session", `${options.executionProvider ?? "cpu"}: ${errorMessage(u)}`)
    });
    const compiled = { session, graph, released: false };
    sessions.set(key2, compiled);
    yield* Scope.addFinalizer(scope, release(compiled));
    if (sessions.size > (options.maxSessions ?? 8)) {
      const [oldest, evicted] = sessions.entries().next().value;
      sessions.delete(oldest);
      yield* release(evicted);
    }
    return compiled;
  });
  const validate3 = (mb) => {
    const cells = mb.batch * mb.length;
    if (!(mb.batch > 0 && mb.length > 0)) return fail2("BadBatch", `empty micro-batch ${mb.batch} \xD7 ${mb.length}`);
    for (const [name2, a] of Object.entries(mb)) {
      if (ArrayBuffer.isView(a) && name2 !== "sequenceIndex" && a.length !== cells) {
        return fail2("BadBatch", `${name2} has ${a.length} entries, expected ${cells}`);
      }
    }
    for (const ids of [mb.inputIds, mb.targets]) {
      for (let i = 0; i < cells; i++) {
        if (ids[i] < 0 || ids[i] >= model.vocabSize) {
          return fail2("BadBatch", `token id ${ids[i]} at ${i} is outside the vocabulary of ${model.vocabSize}`);
        }
      }
    }
    return void 0;
  };
  const batchFeeds = (graph, mb) => {
    const dims = [mb.batch, mb.length];
    const f32 = (a) => new ort.Tensor("float32", a instanceof Float32Array ? a : Float32Array.from(a), dims);
    const data = {
      targets: () => new ort.Tensor("int64", int64s(mb.targets), dims),
      loss_weights: () => f32(mb.weights),
      loss_mask: () => f32(mb.mask),
      advantages: () => f32(mb.advantages),
      // Without a recomputed proximal policy the sampler's logprobs stand in for the old policy.
      old_logprobs: () => f32(mb.oldLogprobs ?? mb.samplerLogprobs),
      sampler_logprobs: () => f32(mb.samplerLogprobs),
      ref_logprobs: () => f32(mb.refLogprobs)
    };
    const out = { ...model.inputs(mb) };
    for (const name2 of graph.lossInputs) out[name2] = data[name2]();
    return out;
  };
  const feeds = (c, mb) => {
    const out = batchFeeds(c.graph, mb);
    for (const { name: name2, dims: d } of c.graph.weights) out[name2] = new ort.Tensor("float32", params.get(name2), [...d]);
    return out;
  };
  const run3 = (c, mb) => Effect23.tryPromise({ try: () => c.session.run(feeds(c, mb)), catch: (u) => fail2("Run", errorMessage(u)) });
  const summarize = (out) => {
    const stats = out["stats"].data;
    return {
      loss: out["loss"].data[0],
      tokenLogprobs: out["token_logprobs"].data,
      tokens: stats[0],
      clipped: stats[1],
      clippedLower: stats[2],
      approxKl: stats[3],
      entropy: stats[4],
      kl: stats[5]
    };
  };
  let pool;
  let liveThreads = 0;
  let compiledOn = [];
  const shardsAccumulated = Array.from({ length: workers }, () => 0);
  const everyWorker = shardsAccumulated.map((_, j) => j);
  let weightsVersion = 0;
  const graphs = /* @__PURE__ */ new Map();
  const clear = () => {
    shardsAccumulated.fill(0);
    accumulated = 0;
  };
  const dropPool = Effect23.suspend(() => {
    const p = pool;
    pool = void 0;
    return p === void 0 ? Effect23.void : p.close("5 seconds");
  });
  yield* Scope.addFinalizer(scope, dropPool);
  const usePool = Effect23.gen(function* () {
    const broken = pool?.broken();
    if (broken !== void 0) {
      yield* dropPool;
      if (accumulated > 0) {
        clear();
        return yield* fail2("Run", `${broken}; the gradients accumulated since the last step were discarded`);
      }
    }
    if (pool !== void 0) return pool;
    const p = yield* start2(Array.from({ length: workers }, (_, index2) => ({
      index: index2,
      layout,
      params: shared.params,
      m: shared.m,
      v: shared.v,
      accum: shared.accum,
      grads: shared.grads,
      slice: [Math.floor(layout.total * index2 / workers), Math.floor(layout.total * (index2 + 1) / workers)],
      sessionOptions
    })), () => liveThreads--);
    liveThreads += p.size;
    pool = p;
    compiledOn = Array.from({ length: workers }, () => /* @__PURE__ */ new Set());
    return p;
  });
  const afterFailure = (clearGradients) => Effect23.suspend(() => {
    const broken = pool?.broken() !== void 0;
    if (clearGradients || broken) clear();
    return broken ? dropPool : Effect23.void;
  });
  const graphFor = Effect23.fnUntraced(function* (p, batch, length, grads) {
    const key2 = `${grads ? "train" : "fwd"}:${batch}x${length}`;
    const hit = graphs.get(key2);
    graphs.delete(key2);
    const entry = hit ?? (yield* Effect23.map(buildGraph(batch, length, grads), (graph) => ({
      graph,
      bytes: toModelBytes(graph.graph)
    })));
    graphs.set(key2, entry);
    if (graphs.size > Math.max(2, options.maxSessions ?? 8)) {
      const oldest = graphs.keys().next().value;
      graphs.delete(oldest);
      for (const [j, keys] of compiledOn.entries()) {
        if (keys.delete(oldest)) yield* Effect23.ignore(p.request(j, { op: "release", key: oldest }));
      }
    }
    return { key: key2, ...entry };
  });
  const runShards = Effect23.fnUntraced(function* (mb, withGradients) {
    const p = yield* usePool;
    const shards = shardRanges(mb.batch, p.size);
    const entries = [];
    for (const [r0, r1] of shards) entries.push(yield* graphFor(p, r1 - r0, mb.length, withGradients));
    const results = yield* Effect23.forEach(shards, ([r0, r1], j) => Effect23.gen(function* () {
      const { key: key2, graph, bytes: bytes2 } = entries[j];
      if (!compiledOn[j].has(key2)) {
        const gradients2 = [...graph.gradients];
        yield* p.request(j, { op: "compile", key: key2, bytes: bytes2, weights: graph.weights, gradients: gradients2 });
        compiledOn[j].add(key2);
      }
      const plain = {};
      for (const [name2, t] of Object.entries(batchFeeds(graph, shardOf(mb, r0, r1)))) plain[name2] = toFeed(t);
      const accumulate = !withGradients ? "none" : shardsAccumulated[j] === 0 ? "set" : "add";
      const out = yield* p.request(j, { op: "run", key: key2, version: weightsVersion, feeds: plain, accumulate });
      return out.run;
    }), { concurrency: "unbounded" });
    if (withGradients) for (let j = 0; j < shards.length; j++) shardsAccumulated[j]++;
    return combine2(mb, shards, results);
  });
  const reduce2 = (p) => {
    const sources = shardsAccumulated.flatMap((n, j) => n > 0 ? [j] : []);
    return Effect23.forEach(everyWorker, (j) => p.request(j, { op: "reduce", sources }), { concurrency: "unbounded" }).pipe(Effect23.map((outs) => Math.sqrt(outs.reduce((sum, o) => sum + o.norm * o.norm, 0))));
  };
  const forwardBackward = (mb) => lock.withPermits(1)(Effect23.gen(function* () {
    const bad = validate3(mb);
    if (bad !== void 0) return yield* bad;
    if (shared !== void 0) {
      const result = yield* runShards(mb, true).pipe(Effect23.onError(() => afterFailure(true)));
      accumulated++;
      return result;
    }
    const c = yield* compile2(mb.batch, mb.length, true);
    const out = yield* run3(c, mb);
    for (const [w, gradName] of c.graph.gradients) {
      const g = out[gradName].data;
      const acc = accum.get(w);
      if (accumulated === 0) acc.set(g);
      else for (let i = 0; i < acc.length; i++) acc[i] += g[i];
    }
    accumulated++;
    return summarize(out);
  }));
  const applyUpdate = (lr, scale) => {
    if (shared === void 0) {
      return Effect23.sync(() => step2(params, accum, state, lr, options.optimizer, scale));
    }
    const p = pool;
    const request = { op: "adam", step: state.step, lr, scale, config: options.optimizer };
    weightsVersion++;
    return Effect23.forEach(everyWorker, (j) => p.request(j, request), { concurrency: "unbounded", discard: true }).pipe(Effect23.map(() => ++state.step));
  };
  const optimStep = lock.withPermits(1)(Effect23.uninterruptible(Effect23.gen(function* () {
    if (accumulated === 0) return yield* fail2("NothingAccumulated", "optimStep before any forwardBackward");
    const gradNorm = shared === void 0 ? globalNorm(accum) : yield* reduce2(yield* usePool);
    if (!Number.isFinite(gradNorm)) {
      clear();
      return yield* fail2("NonFiniteGradient", `gradient norm is ${gradNorm}; the update was skipped`);
    }
    const lr = at(options.schedule, state.step);
    const scale = clipScale(gradNorm, options.optimizer.maxGradNorm);
    const step3 = yield* applyUpdate(lr, scale);
    clear();
    return { step: step3, gradNorm, lr };
  }).pipe(Effect23.onError(() => afterFailure(true)))));
  const logprobs2 = (mb) => lock.withPermits(1)(Effect23.gen(function* () {
    const bad = validate3(mb);
    if (bad !== void 0) return yield* bad;
    if (shared !== void 0) return yield* runShards(mb, false).pipe(Effect23.onError(() => afterFailure(false)));
    return summarize(yield* run3(yield* compile2(mb.batch, mb.length, false), mb));
  }));
  const snapshot = () => new Map([...params].map(([k, v]) => [k, Float32Array.from(v)]));
  const save2 = (dir, meta) => lock.withPermits(1)(Effect23.suspend(
    () => save(dir, {
      weights: model.parameters.map((p) => ({ name: p.name, shape: p.shape, data: params.get(p.name) })),
      optimizer: state,
      policyVersion: meta.policyVersion,
      rngState: meta.rngState
    })
  )).pipe(Effect23.provideService(FileSystem7.FileSystem, fs), Effect23.mapError((e) => fail2("Checkpoint", e.message)));
  const load6 = (dir) => lock.withPermits(1)(Effect23.gen(function* () {
    const loaded = yield* load4(dir, model.parameters);
    for (const [name2, w] of loaded.weights) params.get(name2).set(w);
    if (shared === void 0) state = loaded.optimizer;
    else {
      for (const [name2, m] of loaded.optimizer.m) state.m.get(name2).set(m);
      for (const [name2, v] of loaded.optimizer.v) state.v.get(name2).set(v);
      state.step = loaded.optimizer.step;
    }
    weightsVersion++;
    clear();
    return { policyVersion: loaded.policyVersion, rngState: loaded.rngState };
  })).pipe(Effect23.provideService(FileSystem7.FileSystem, fs), Effect23.mapError((e) => fail2("Checkpoint", e.message)));
  const trainer = PolicyTrainer.of({
    forwardBackward,
    logprobs: (batch) => Effect23.map(logprobs2(batch), (r) => r.tokenLogprobs),
    optimStep,
    discard: lock.withPermits(1)(Effect23.sync(clear)),
    // With workers, AdamW runs off this thread: a snapshot waits for the step to finish.
    weights: shared === void 0 ? Effect23.sync(snapshot) : lock.withPermits(1)(Effect23.sync(snapshot)),
    step: Effect23.sync(() => state.step),
    save: save2,
    load: load6
  });
  const gradients = lock.withPermits(1)(Effect23.gen(function* () {
    if (pool !== void 0 && accumulated > 0) yield* reduce2(pool);
    else if (accumulated === 0) for (const a of accum.values()) a.fill(0);
    return new Map([...accum].map(([k, v]) => [k, Float32Array.from(v)]));
  }));
  const threads = {
    live: Effect23.sync(() => liveThreads),
    kill: (index2) => Effect23.suspend(() => pool === void 0 ? Effect23.void : pool.kill(index2)),
    close: (wait) => Effect23.suspend(() => {
      const p = pool;
      pool = void 0;
      return p === void 0 ? Effect23.void : p.close(wait);
    })
  };
  return { trainer, logprobs: logprobs2, gradients, threads };
});
var makeReference = Effect23.fn("OnnxTrainer.makeReference")(function* (model, weights, options = {}) {
  const frozen = yield* make11({
    ...options,
    model,
    weights,
    loss: sft,
    optimizer: defaultConfig,
    schedule: constant(0)
  });
  return (batch) => Effect23.map(frozen.logprobs(batch), (r) => r.tokenLogprobs);
});

// src/Packing.ts
import { Effect as Effect24, Schema as Schema24 } from "effect";
var PackingError = class extends Schema24.TaggedError()("PackingError", {
  reason: Schema24.Literals(["SequenceTooLong", "ShapeMismatch", "BadBudget"]),
  message: Schema24.String
}) {
};

// src/Dataset.ts
import { Effect as Effect25, FileSystem as FileSystem8, Result as Result2, Schema as Schema25 } from "effect";
var DatasetErrorReason = Schema25.Literals([
  "Unreadable",
  // the file does not exist or cannot be read
  "Malformed",
  // not a JSON array or JSONL at all
  "InvalidRow",
  // a row failed validation and `onInvalid` is "stop"
  "Empty"
  // no valid row
]);
var DatasetError = class extends Schema25.TaggedError()("DatasetError", {
  dataset: Schema25.String,
  reason: DatasetErrorReason,
  line: Schema25.optionalKey(Schema25.Int),
  message: Schema25.String
}) {
};
var Fields2 = Schema25.Struct({
  question: Schema25.optionalKey(Schema25.String),
  messages: Schema25.optionalKey(Conversation)
});
var decodeJson = Schema25.decodeUnknownResult(Schema25.fromJsonString(Schema25.Unknown));
var decodeFields = Schema25.decodeUnknownResult(Fields2);
var isRecord2 = (u) => typeof u === "object" && u !== null && !Array.isArray(u);
var validate = (text4, kind) => {
  const json = decodeJson(text4);
  if (Result2.isFailure(json)) return Result2.fail(`not valid JSON (${json.failure.message.split("\n")[0]})`);
  const value = json.success;
  if (!isRecord2(value)) return Result2.fail(`expected an object, got ${Array.isArray(value) ? "an array" : typeof value}`);
  const decoded = decodeFields(value);
  if (Result2.isFailure(decoded)) return Result2.fail(decoded.failure.message.replace(/\n\s*/g, " "));
  const { messages, question } = decoded.success;
  if (kind === "conversation") {
    if (messages === void 0) return Result2.fail("a demonstration needs `messages`");
    if (!messages.some((m) => m.role === "assistant")) return Result2.fail("`messages` has no assistant message");
  } else if (messages === void 0 || messages.length === 0) {
    if (question === void 0) return Result2.fail("a row needs a `question` or `messages`");
    if (question.trim() === "") return Result2.fail("`question` is empty");
  }
  const { messages: _m, question: _q, ...fields } = value;
  return Result2.succeed({
    ...question === void 0 ? {} : { question },
    ...messages === void 0 ? {} : { messages },
    fields
  });
};
var splitJsonArray = (text4) => {
  const out = [];
  let line = 1;
  let depth = 0;
  let inString = false;
  let start3 = -1;
  let startLine = 1;
  const flush = (end) => {
    const element = text4.slice(start3, end);
    if (element.trim() !== "") out.push({ line: startLine, text: element });
    start3 = -1;
  };
  for (let i = 0; i < text4.length; i++) {
    const c = text4[i];
    if (c === "\n") line++;
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
      continue;
    }
    if (depth === 1 && start3 === -1 && !/\s|,|\]/.test(c)) {
      start3 = i;
      startLine = line;
    }
    if (c === '"') inString = true;
    else if (c === "[" || c === "{") depth++;
    else if (c === "]" || c === "}") {
      depth--;
      if (depth === 0) {
        if (start3 !== -1) flush(i);
        return text4.slice(i + 1).trim() === "" ? out : void 0;
      }
    } else if (c === "," && depth === 1 && start3 !== -1) flush(i);
  }
  return void 0;
};
var splitJsonl = (text4) => text4.split("\n").flatMap((t, i) => t.trim() === "" ? [] : [{ line: i + 1, text: t }]);
var parse3 = (name2, text4, options = {}) => Effect25.gen(function* () {
  const kind = options.kind ?? "prompt";
  const isArray = text4.trimStart().startsWith("[");
  const pieces = isArray ? splitJsonArray(text4) : splitJsonl(text4);
  if (pieces === void 0) {
    return yield* new DatasetError({ dataset: name2, reason: "Malformed", message: "unterminated JSON array" });
  }
  const rows = [];
  const skipped = [];
  for (const piece of pieces) {
    const result = validate(piece.text, kind);
    if (Result2.isSuccess(result)) {
      rows.push({ index: rows.length, line: piece.line, ...result.success });
    } else if (options.onInvalid === "skip") {
      skipped.push({ line: piece.line, message: result.failure });
    } else {
      return yield* new DatasetError({
        dataset: name2,
        reason: "InvalidRow",
        line: piece.line,
        message: `${name2}:${piece.line}: ${result.failure}`
      });
    }
  }
  if (rows.length === 0) {
    return yield* new DatasetError({ dataset: name2, reason: "Empty", message: `${name2}: no valid row` });
  }
  return { name: name2, rows, skipped };
});
var load5 = Effect25.fn("Dataset.load")(function* (path, options = {}) {
  const fs = yield* FileSystem8.FileSystem;
  const text4 = yield* fs.readFileString(path).pipe(
    Effect25.mapError((e) => new DatasetError({ dataset: path, reason: "Unreadable", message: `${path}: ${e.message}` }))
  );
  const dataset = yield* parse3(path, text4, options);
  return options.fields === void 0 ? dataset : yield* refine(dataset, options.fields, options);
});
var refine = (dataset, fields, options = {}) => Effect25.gen(function* () {
  const decode2 = Schema25.decodeUnknownResult(fields);
  const rows = [];
  const skipped = [...dataset.skipped];
  for (const row of dataset.rows) {
    const decoded = decode2(row.fields, { errors: "all" });
    if (Result2.isSuccess(decoded)) {
      rows.push({ ...row, index: rows.length, fields: { ...row.fields, ...decoded.success } });
      continue;
    }
    const message2 = decoded.failure.message.replace(/\n\s*/g, " ");
    if (options.onInvalid === "skip") {
      skipped.push({ line: row.line, message: message2 });
    } else {
      return yield* new DatasetError({
        dataset: dataset.name,
        reason: "InvalidRow",
        line: row.line,
        message: `${dataset.name}:${row.line}: ${message2}`
      });
    }
  }
  if (rows.length === 0) {
    return yield* new DatasetError({ dataset: dataset.name, reason: "Empty", message: `${dataset.name}: no valid row` });
  }
  return { name: dataset.name, rows, skipped };
});
var writeSplits = Effect25.fn("Dataset.writeSplits")(function* (dir, splits) {
  const fs = yield* FileSystem8.FileSystem;
  yield* fs.makeDirectory(dir, { recursive: true });
  const counts = {};
  for (const name2 of Object.keys(splits)) {
    const rows = splits[name2];
    yield* fs.writeFileString(`${dir}/${name2.toLowerCase()}.jsonl`, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
    counts[name2] = rows.length;
  }
  return counts;
});

// src/Report.ts
import { Effect as Effect26, FileSystem as FileSystem9, Schema as Schema26 } from "effect";
var MetricsRecord = Schema26.Struct({
  phase: Schema26.Literals(["warmup", "train", "eval"]),
  step: Schema26.Int,
  elapsed: Schema26.Number,
  figures: Schema26.Record(Schema26.String, Schema26.Number)
});
var SampleRecord = Schema26.Struct({
  phase: Schema26.Literals(["train", "eval"]),
  step: Schema26.Int,
  groupId: Schema26.String,
  reward: Schema26.Number,
  termination: Schema26.String,
  spans: Schema26.Array(Schema26.Struct({
    source: Schema26.String,
    tokens: Schema26.Array(Schema26.String),
    logprobs: Schema26.optionalKey(Schema26.Array(Schema26.Number))
  }))
});
var palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"];
var escape = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
var ticks = (lo, hi, count = 5) => {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step3 = [1, 2, 5, 10].map((m) => m * power).sort((a, b) => Math.abs((hi - lo) / a - count) - Math.abs((hi - lo) / b - count))[0];
  const out = [];
  for (let t = Math.ceil(lo / step3) * step3; t <= hi + step3 * 1e-9; t += step3) out.push(Number(t.toPrecision(12)));
  return out;
};
var finitePoints = (s) => s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
var legendLayout = (names, width) => {
  let [x, row] = [0, 0];
  const at2 = names.map((name2) => {
    const w = 24 + name2.length * 6;
    if (x > 0 && x + w > width) [x, row] = [0, row + 1];
    const here = { x, row };
    x += w;
    return here;
  });
  return { at: at2, rows: row + 1 };
};
var label = (x) => {
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return x.toExponential(1);
  return Number(x.toPrecision(4)).toString();
};
var lineChart = (options) => {
  const width = options.width ?? 420;
  const height = options.height ?? 240;
  const m = { left: 52, right: 12, top: 28, bottom: 40 };
  const series = options.series.filter((s) => finitePoints(s).length > 0);
  const legendAt = legendLayout(series.map((s) => s.name), width - m.left - m.right - 36);
  const full = height + (legendAt.rows - 1) * 14;
  const head = `<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 ${width} ${full}" width="${width}" height="${full}"><title>${escape(options.title)}</title><text x="${m.left}" y="16" class="chart-title">${escape(options.title)}</text>`;
  if (series.length === 0) {
    return head + `<text x="${width / 2}" y="${height / 2}" text-anchor="middle" class="nodata">no data</text></svg>`;
  }
  const all = series.flatMap(finitePoints);
  const xs = all.map(([x]) => x);
  const ys = all.map(([, y]) => y);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) [x0, x1] = [x0 - 1, x1 + 1];
  if (y1 === y0) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.1, y1 + (Math.abs(y1) || 1) * 0.1];
  const px = (x) => m.left + (x - x0) / (x1 - x0) * (width - m.left - m.right);
  const py = (y) => height - m.bottom - (y - y0) / (y1 - y0) * (height - m.top - m.bottom);
  const grid = ticks(y0, y1, 4).map(
    (t) => `<line x1="${m.left}" x2="${width - m.right}" y1="${py(t).toFixed(1)}" y2="${py(t).toFixed(1)}" class="grid"/><text x="${m.left - 6}" y="${(py(t) + 4).toFixed(1)}" text-anchor="end" class="tick">${label(t)}</text>`
  ).join("");
  const xTicks = ticks(x0, x1, 5).map(
    (t) => `<text x="${px(t).toFixed(1)}" y="${height - m.bottom + 16}" text-anchor="middle" class="tick">${label(t)}</text>`
  ).join("");
  const lines = series.map((s, i) => {
    const color = palette[i % palette.length];
    const pts = finitePoints(s);
    const path = pts.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    const dots = pts.length <= 40 ? pts.map(([x, y]) => `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="2.5" fill="${color}"/>`).join("") : "";
    return `<polyline class="series" data-name="${escape(s.name)}" fill="none" stroke="${color}" stroke-width="1.8" points="${path}"/>${dots}`;
  }).join("");
  const legend = series.map(
    (s, i) => `<g transform="translate(${m.left + legendAt.at[i].x},${height - 10 + legendAt.at[i].row * 14})"><rect width="10" height="10" y="-9" fill="${palette[i % palette.length]}"/><text x="14" class="legend">${escape(s.name)}</text></g>`
  ).join("");
  const axes = `<line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${height - m.bottom}" class="axis"/><line x1="${m.left}" x2="${width - m.right}" y1="${height - m.bottom}" y2="${height - m.bottom}" class="axis"/><text x="${width - m.right}" y="${height - m.bottom + 30}" text-anchor="end" class="tick">${escape(options.xLabel ?? "step")}</text>`;
  return head + grid + axes + xTicks + lines + legend + "</svg>";
};
var trainCounts = (prefix) => [{ phase: "train", prefix, absentIsZero: true }];
var perPool = (figures) => figures.map(([figure, label2]) => ({
  phase: "train",
  prefix: "env/",
  suffix: `/${figure}`,
  ...label2 === void 0 ? {} : { label: label2 }
}));
var charts = [
  {
    title: "Reward",
    series: [{ name: "train (sampled)", phase: "train", key: "rollout/reward_mean" }, {
      name: "held-out",
      phase: "eval",
      key: "eval/reward_mean"
    }]
  },
  {
    title: "Accuracy",
    series: [{ name: "held-out", phase: "eval", key: "eval/accuracy" }, {
      name: "train (sampled)",
      phase: "train",
      key: "rollout/accuracy"
    }]
  },
  {
    title: "Invalid tool-call rate",
    series: [{ name: "train", phase: "train", key: "rollout/invalid_tool_call_rate" }, {
      name: "held-out",
      phase: "eval",
      key: "eval/invalid_tool_call_rate"
    }]
  },
  { title: "Turns per trajectory", series: [{ name: "mean turns", phase: "train", key: "rollout/turns_mean" }] },
  { title: "Tool calls per tool", series: [], families: trainCounts("rollout/tool_calls/") },
  {
    title: "Failures by reason (train)",
    series: [],
    families: trainCounts("rollout/failures/"),
    optional: true
  },
  { title: "Tool errors by reason", series: [], families: trainCounts("rollout/tool_errors/"), optional: true },
  { title: "Episode ends", series: [], families: trainCounts("rollout/episode_end/"), optional: true },
  {
    title: "KL",
    series: [{ name: "to reference", phase: "train", key: "learner/kl" }, {
      name: "approx. old \u2192 new",
      phase: "train",
      key: "learner/approx_kl"
    }]
  },
  { title: "Entropy", series: [{ name: "entropy", phase: "train", key: "learner/entropy" }] },
  { title: "Clip fraction", series: [{ name: "clip fraction", phase: "train", key: "learner/clip_frac" }] },
  { title: "Throughput (tokens/s)", series: [{ name: "train", phase: "train", key: "perf/tokens_per_s" }] },
  { title: "Policy loss", series: [{ name: "loss", phase: "train", key: "learner/loss" }] },
  { title: "Warm-up loss (SFT)", series: [{ name: "masked NLL", phase: "warmup", key: "warmup/loss" }] },
  {
    title: "Warm-up validation accuracy",
    series: [{ name: "greedy", phase: "warmup", key: "warmup/validation_accuracy" }]
  },
  {
    title: "Peak RSS (MB)",
    series: [{ name: "RL step", phase: "train", key: "perf/peak_rss_mb" }, {
      name: "evaluation",
      phase: "eval",
      key: "perf/peak_rss_mb"
    }],
    optional: true,
    group: "Memory"
  },
  {
    title: "Peak RSS, warm-up (MB)",
    series: [{ name: "warm-up step", phase: "warmup", key: "perf/peak_rss_mb" }],
    optional: true,
    group: "Memory"
  },
  {
    title: "Acquire wait (ms)",
    series: [],
    families: perPool([["acquire_wait_p50_ms", "p50"], ["acquire_wait_p99_ms", "p99"]]),
    optional: true,
    group: "Environment pools"
  },
  {
    title: "Crashes (since start)",
    series: [],
    families: perPool([["crashes"]]),
    optional: true,
    group: "Environment pools"
  },
  {
    title: "Resets for reuse (since start)",
    series: [],
    families: perPool([["resets"]]),
    optional: true,
    group: "Environment pools"
  }
];
var seriesOf = (metrics, phase, key2) => metrics.flatMap((r) => r.phase === phase && r.figures[key2] !== void 0 ? [[r.step, r.figures[key2]]] : []);
var familySeries = (metrics, family) => {
  const suffix = family.suffix ?? "";
  const records = metrics.filter((r) => r.phase === family.phase);
  const keys = [...new Set(records.flatMap((r) => Object.keys(r.figures)))].filter((k) => k.startsWith(family.prefix) && k.endsWith(suffix) && k.length > family.prefix.length + suffix.length).sort();
  return keys.map((key2) => {
    const name2 = key2.slice(family.prefix.length, key2.length - suffix.length);
    return {
      name: family.label === void 0 ? name2 : `${name2} ${family.label}`,
      points: family.absentIsZero ? records.map((r) => [r.step, r.figures[key2] ?? 0]) : seriesOf(metrics, family.phase, key2)
    };
  });
};
var chartSeries = (metrics, chart) => [
  ...chart.series.map((s) => ({ name: s.name, points: seriesOf(metrics, s.phase, s.key) })),
  ...(chart.families ?? []).flatMap((f) => familySeries(metrics, f)).sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0)
];
var chartSections = (metrics) => {
  const sections = /* @__PURE__ */ new Map();
  for (const chart of charts) {
    const series = chartSeries(metrics, chart);
    if (chart.optional && !series.some((s) => finitePoints(s).length > 0)) continue;
    const group = chart.group ?? "Training curves";
    sections.set(group, [...sections.get(group) ?? [], lineChart({ title: chart.title, series })]);
  }
  return [...sections].map(([group, svgs]) => `<h2>${escape(group)}</h2><div class="charts">${svgs.join("")}</div>`).join("");
};
var sourceColours = {
  prompt: "#e5e7eb",
  policy: "#bbf7d0",
  tool: "#fed7aa",
  env: "#e9d5ff",
  template: "#dbeafe"
};
var showToken = (token) => escape(token).replace(/\n/g, "\u21B5\n").replace(/\t/g, "\u2192").replace(/ /g, "&#183;");
var selectSamples = (samples, maxSteps = 12) => {
  const keep = /* @__PURE__ */ new Set();
  for (const phase of ["train", "eval"]) {
    const steps = [...new Set(samples.filter((s) => s.phase === phase).map((s) => s.step))].sort((a, b) => a - b);
    const n = Math.min(maxSteps, steps.length);
    for (let i = 0; i < n; i++) {
      keep.add(`${phase} ${steps[n === 1 ? 0 : Math.round(i * (steps.length - 1) / (n - 1))]}`);
    }
  }
  return samples.filter((s) => keep.has(`${s.phase} ${s.step}`));
};
var viewer = (all) => {
  if (all.length === 0) return `<p class="nodata">No sampled trajectories were recorded.</p>`;
  const samples = selectSamples(all);
  const steps = [...new Set(samples.map((s) => `${s.phase} ${s.step}`))];
  const options = steps.map((s) => `<option value="${escape(s)}">${escape(s)}</option>`).join("");
  const cards = samples.map((sample, i) => {
    const tokens = sample.spans.map(
      (span) => span.tokens.map((t, j) => {
        const lp = span.logprobs?.[j];
        const title = `${span.source}${lp === void 0 ? "" : ` \xB7 logprob ${lp.toFixed(3)}`}`;
        return `<span class="tok src-${escape(span.source)}" title="${escape(title)}">${showToken(t)}</span>`;
      }).join("")
    ).join("");
    const trained = sample.spans.reduce((n, s) => n + (s.source === "policy" ? s.tokens.length : 0), 0);
    const total = sample.spans.reduce((n, s) => n + s.tokens.length, 0);
    return `<div class="card" data-step="${escape(`${sample.phase} ${sample.step}`)}" id="sample-${i}"><div class="meta">${escape(sample.phase)} step ${sample.step} \xB7 group ${escape(sample.groupId)} \xB7 <b>reward ${sample.reward.toFixed(3)}</b> \xB7 ${escape(sample.termination)} \xB7 ${trained}/${total} tokens trained</div><pre class="tokens">${tokens}</pre></div>`;
  }).join("");
  const legend = Object.entries(sourceColours).map(
    ([source, colour]) => `<span class="tok" style="background:${colour}">${source}</span>`
  ).join(" ");
  return `<p>Sources: ${legend} \u2014 only <b>policy</b> tokens are in the loss mask. Hover a token for its logprob.</p><label>Step <select id="step-filter"><option value="">all</option>${options}</select></label><div id="viewer">${cards}</div>`;
};
var summary = (metrics) => {
  const evals = metrics.filter((r) => r.phase === "eval");
  if (evals.length === 0) return "";
  const first = evals[0];
  const last = evals.at(-1);
  const row = (name2, key2) => {
    const a = first.figures[key2];
    const b = last.figures[key2];
    if (a === void 0 && b === void 0) return "";
    const fmt = (x) => x === void 0 ? "\u2013" : x.toFixed(3);
    const delta = a !== void 0 && b !== void 0 ? `${b - a >= 0 ? "+" : ""}${(b - a).toFixed(3)}` : "\u2013";
    return `<tr><td>${name2}</td><td>${fmt(a)}</td><td>${fmt(b)}</td><td>${delta}</td></tr>`;
  };
  return `<table class="summary"><tr><th>held-out</th><th>step ${first.step} (before RL)</th><th>step ${last.step}</th><th>change</th></tr>` + row("accuracy", "eval/accuracy") + row("invalid tool-call rate", "eval/invalid_tool_call_rate") + row("reward", "eval/reward_mean") + `</table>`;
};
var style = `body{font:14px system-ui,sans-serif;margin:24px;color:#111}h1{font-size:20px}h2{font-size:16px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{background:#fff;border:1px solid #e5e7eb;border-radius:6px}
.chart-title{font-weight:600;font-size:13px}.tick,.legend{font-size:10px;fill:#374151}.grid{stroke:#f3f4f6}
.axis{stroke:#9ca3af}.nodata{fill:#9ca3af;color:#6b7280}.summary{border-collapse:collapse}
.summary td,.summary th{border:1px solid #e5e7eb;padding:4px 10px;text-align:right}
.card{border:1px solid #e5e7eb;border-radius:6px;margin:10px 0;padding:8px}.meta{font-size:12px;color:#374151}
.tokens{white-space:pre-wrap;word-break:break-all;font:12px ui-monospace,monospace;line-height:1.7;margin:6px 0 0}
.tok{border-radius:2px;padding:0 1px;margin:0 0.5px}` + Object.entries(sourceColours).map(([s, c]) => `.src-${s}{background:${c}}`).join("");
var script = `document.getElementById("step-filter")?.addEventListener("change",function(e){var v=e.target.value;document.querySelectorAll("#viewer .card").forEach(function(c){c.style.display=!v||c.dataset.step===v?"":"none"})})`;
var render2 = (input) => {
  const config = input.config === void 0 ? "" : `<details><summary>Configuration</summary><pre>${escape(JSON.stringify(input.config, null, 2))}</pre></details>`;
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escape(input.title)}</title><meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"><style>${style}</style></head><body><h1>${escape(input.title)}</h1>${summary(input.metrics)}` + chartSections(input.metrics) + `<h2>Sampled trajectories</h2>${viewer(input.samples)}${config}<script>${script}</script></body></html>
`;
};
var decodeMetrics = Schema26.decodeUnknownResult(Schema26.fromJsonString(MetricsRecord));
var decodeSample = Schema26.decodeUnknownResult(Schema26.fromJsonString(SampleRecord));
var read = Effect26.fn("Report.read")(function* (dir) {
  const fs = yield* FileSystem9.FileSystem;
  const lines = (name2) => fs.readFileString(`${dir}/${name2}`).pipe(
    Effect26.map((text4) => text4.split("\n").filter((l) => l.trim() !== "")),
    Effect26.orElseSucceed(() => [])
  );
  const metrics = (yield* lines("metrics.jsonl")).flatMap((l) => {
    const r = decodeMetrics(l);
    return r._tag === "Success" ? [r.success] : [];
  });
  const samples = (yield* lines("samples.jsonl")).flatMap((l) => {
    const r = decodeSample(l);
    return r._tag === "Success" ? [r.success] : [];
  });
  return { metrics, samples };
});
var write = Effect26.fn("Report.write")(function* (dir, options = {}) {
  const fs = yield* FileSystem9.FileSystem;
  const { metrics, samples } = yield* read(dir);
  const config = yield* fs.readFileString(`${dir}/config.json`).pipe(
    Effect26.flatMap(Schema26.decodeUnknownEffect(Schema26.fromJsonString(Schema26.Unknown))),
    Effect26.orElseSucceed(() => void 0)
  );
  const title = options.title ?? `agentfly run: ${dir.replace(/\/+$/, "").split("/").at(-1)}`;
  const path = `${dir}/report.html`;
  yield* fs.writeFileString(path, render2({ title, metrics, samples, config }));
  return path;
});

// src/TrainConfig.ts
import { Effect as Effect27, FileSystem as FileSystem10, Path as Path5, Schema as Schema27, SchemaAST, SchemaIssue } from "effect";
import * as Yaml from "yaml";
var IntIn = (minimum, maximum) => Schema27.Int.check(Schema27.isBetween({ minimum, maximum }));
var NumberIn = (minimum, maximum) => Schema27.Number.check(Schema27.isBetween({ minimum, maximum }));
var PositiveUpTo = (maximum) => Schema27.Number.check(Schema27.isBetween({ minimum: 0, maximum, exclusiveMinimum: true }));
var Probability = NumberIn(0, 1);
var Steps = IntIn(1, 1e7);
var Seed = IntIn(0, 4294967295);
var LearningRate = PositiveUpTo(1);
var Temperature = NumberIn(0, 10);
var withDefault = (schema, value) => schema.pipe(Schema27.withDecodingDefaultKey(Effect27.succeed(value)));
var ModelConfig2 = Schema27.Struct({
  path: Schema27.String,
  preset: Schema27.optionalKey(Schema27.String),
  initSeed: withDefault(Seed, 0)
});
var DataConfig = Schema27.Struct({
  train: Schema27.String,
  eval: Schema27.optionalKey(Schema27.String),
  onInvalidRow: withDefault(Schema27.Literals(["stop", "skip"]), "stop")
});
var AgentConfig = Schema27.Struct({
  /** A built-in template name (`qwen2.5`, `qwen3`, `llama3`, `chatml`) or `model`: the model folder's own. */
  template: withDefault(Schema27.String, "model"),
  parser: withDefault(Schema27.String, "hermes"),
  systemPrompt: Schema27.optionalKey(Schema27.String),
  /** Render the tool list into the prompt (off for tiny policies that learn the tools from demonstrations). */
  renderTools: withDefault(Schema27.Boolean, true),
  maxTurns: withDefault(IntIn(1, 1e3), 4),
  numChains: withDefault(IntIn(1, 1024), 8),
  maxNewTokens: withDefault(IntIn(1, 1048576), 256),
  maxContextTokens: Schema27.optionalKey(IntIn(1, 1048576)),
  temperature: withDefault(Temperature, 1),
  topP: withDefault(Probability, 1),
  /** Seconds a tool call may run when its tool sets no `timeout` (a hang becomes a `Timeout` observation). */
  toolTimeout: withDefault(PositiveUpTo(86400), 30)
});
var AdvantageEstimator = Schema27.Literals(["grpo", "grpo-no-std", "rloo", "reinforce++", "reinforce++-baseline"]);
var LossAggregation = Schema27.Literals([
  "token-mean",
  "seq-mean-token-sum",
  "seq-mean-token-mean",
  "seq-mean-token-sum-norm"
]);
var AlgorithmConfig = Schema27.Struct({
  advantage: withDefault(AdvantageEstimator, "grpo"),
  aggregation: withDefault(LossAggregation, "token-mean"),
  clipLow: withDefault(NumberIn(0, 1), 0.2),
  clipHigh: withDefault(NumberIn(0, 100), 0.2),
  klCoef: withDefault(NumberIn(0, 100), 0),
  entropyCoef: withDefault(NumberIn(0, 100), 0),
  lr: withDefault(LearningRate, 3e-4),
  lrSchedule: withDefault(Schema27.Literals(["constant", "cosine"]), "constant"),
  lrWarmupSteps: withDefault(IntIn(0, 1e7), 0),
  tisCap: Schema27.optionalKey(PositiveUpTo(1e6)),
  weightDecay: withDefault(NumberIn(0, 1), 0),
  gradClip: withDefault(PositiveUpTo(1e6), 1),
  groupsPerStep: withDefault(IntIn(1, 4096), 8),
  /** Optimiser steps per learner step, each on whole groups (verl's `ppo_mini_batch_size` as a count). */
  miniBatches: withDefault(IntIn(1, 4096), 1),
  /** Passes over a step's mini-batches (verl's `ppo_epochs`). */
  epochs: withDefault(IntIn(1, 100), 1),
  microBatchSize: withDefault(IntIn(1, 4096), 16),
  steps: Steps
});
var WarmupStopConfig = Schema27.Struct({
  data: Schema27.String,
  accuracy: Probability,
  every: withDefault(Steps, 50),
  from: Schema27.optionalKey(Steps),
  size: Schema27.optionalKey(Steps),
  onMiss: withDefault(Schema27.Literals(["continue", "fail"]), "continue")
});
var WarmupConfig = Schema27.Struct({
  data: Schema27.String,
  steps: Steps,
  stopAt: Schema27.optionalKey(WarmupStopConfig),
  lr: withDefault(LearningRate, 2e-3),
  lrSchedule: withDefault(Schema27.Literals(["constant", "cosine"]), "constant"),
  minLr: withDefault(NumberIn(0, 1), 0),
  warmupSteps: withDefault(IntIn(0, 1e7), 0),
  batchSize: withDefault(IntIn(1, 4096), 16)
});
var EvalConfig = Schema27.Struct({
  every: withDefault(Steps, 10),
  size: Schema27.optionalKey(Steps),
  temperature: withDefault(Temperature, 0),
  samples: withDefault(IntIn(1, 1024), 1)
});
var CheckpointConfig = Schema27.Struct({
  every: withDefault(Steps, 10),
  keep: withDefault(IntIn(1, 1e3), 2)
});
var LearnerConfig = Schema27.Struct({
  workers: withDefault(IntIn(1, 64), 2),
  /**
   * Row counts a micro-batch of a given length may take (`Packing.Options.rowSteps`): 4 pads a step's last,
   * partly filled micro-batch to the next quarter of the capacity instead of all of it (≈ 10 % less learner work on
   * the calculator config, up to 4 compiled graphs per length). Default 1, with which the recorded runs were made:
   * another value sums the gradients in another order, so a run's figures differ within noise.
   */
  rowSteps: withDefault(IntIn(1, 64), 1)
});
var EngineConfig = Schema27.Struct({
  thread: Schema27.optionalKey(Schema27.Boolean)
});
var TrainConfig = Schema27.Struct({
  name: Schema27.optionalKey(Schema27.String),
  /**
   * The task: a built-in name (`"calculator"`) or a module path (`"./task.ts"`, exporting `task`), optionally with
   * options (`{ "name": "calculator", "options": { "toolCallFormat": 0.2 } }`). Optional in a task module, which
   * exports its task beside the config.
   */
  task: Schema27.optionalKey(Ref),
  seed: withDefault(Seed, 0),
  output: Schema27.String,
  model: ModelConfig2,
  data: DataConfig,
  agent: withDefault(AgentConfig, {}),
  algorithm: AlgorithmConfig,
  warmup: Schema27.optionalKey(WarmupConfig),
  mode: withDefault(Schema27.Literals(["sync", "async"]), "sync"),
  maxStaleness: withDefault(IntIn(0, 16), 1),
  eval: withDefault(EvalConfig, {}),
  checkpoint: withDefault(CheckpointConfig, {}),
  learner: withDefault(LearnerConfig, {}),
  engine: withDefault(EngineConfig, {}),
  sampleTrajectories: withDefault(IntIn(0, 1e3), 4),
  /**
   * The largest share of a step's trajectories that may fail for infrastructure reasons (environment, lease,
   * reward, sampler, chain defects) before the run stops with a typed error naming the reason; 1 never stops.
   */
  maxFailureShare: withDefault(Probability, 0.5)
});
var ConfigErrorReason = Schema27.Literals(["Unreadable", "Syntax", "Invalid", "UnsupportedFormat"]);
var ConfigError = class extends Schema27.TaggedError()("ConfigError", {
  source: Schema27.String,
  reason: ConfigErrorReason,
  issues: Schema27.Array(Schema27.String)
}) {
  get message() {
    return `${this.source}: ${this.reason === "Invalid" ? "invalid config" : this.reason}
  ` + this.issues.join("\n  ");
  }
};
var formatter = SchemaIssue.makeFormatterDefault();
var decodeStrict = Schema27.decodeUnknownEffect(TrainConfig);
var readModule = (file) => Effect27.tryPromise({
  try: () => import(file),
  catch: (e) => new ConfigError({ source: file, reason: "Syntax", issues: [String(e)] })
});
var read2 = Effect27.fn("TrainConfig.read")(function* (file) {
  const fs = yield* FileSystem10.FileSystem;
  const path = yield* Path5.Path;
  const absolute = path.resolve(file);
  const extension = path.extname(absolute).toLowerCase();
  const dir = path.dirname(absolute);
  if ([".ts", ".mts", ".js", ".mjs"].includes(extension)) {
    const exports = yield* readModule(absolute);
    return { file, dir, raw: exports["default"] ?? exports["config"], exports };
  }
  if ([".json", ".yaml", ".yml"].includes(extension)) {
    const text4 = yield* fs.readFileString(absolute).pipe(
      Effect27.mapError((e) => new ConfigError({ source: file, reason: "Unreadable", issues: [e.message] }))
    );
    const raw = yield* Effect27.try({
      // YAML is a superset of JSON; the yaml parser reports line and column for both.
      try: () => Yaml.parse(text4, { prettyErrors: true, uniqueKeys: true }),
      catch: (e) => new ConfigError({ source: file, reason: "Syntax", issues: [String(e).split("\n")[0]] })
    });
    return { file, dir, raw, exports: {} };
  }
  return yield* new ConfigError({
    source: file,
    reason: "UnsupportedFormat",
    issues: [`expected .json, .yaml, .yml, .ts or .js, got "${extension}"`]
  });
});

// src/Resource.ts
import { Context as Context7, Schema as Schema28 } from "effect";
var SharingScope = Schema28.Literals(["chain", "group", "global"]);
var ResetPolicy = Schema28.Literals(["reset", "recreate"]);
var ResourceKind = Schema28.Literals(["in-process", "docker", "bubblewrap"]);
var NonNegativeInt = Schema28.Int.check(Schema28.isGreaterThanOrEqualTo(0));
var PositiveInt2 = Schema28.Int.check(Schema28.isGreaterThanOrEqualTo(1));
var Millis = Schema28.Int.check(Schema28.isGreaterThanOrEqualTo(1));
var Limits = Schema28.Struct({
  /** Memory cap in bytes (swap is capped at the same value, so nothing spills to swap). */
  memoryBytes: Schema28.optionalKey(PositiveInt2),
  /** CPU share, in cores (0.5 = half a core). */
  cpus: Schema28.optionalKey(Schema28.Finite.check(Schema28.isGreaterThan(0))),
  /** Maximum number of processes and threads. */
  pids: Schema28.optionalKey(PositiveInt2),
  /** `none`: only a loopback interface inside the sandbox. */
  network: Schema28.Literals(["none", "host"]),
  readOnlyRoot: Schema28.Boolean,
  /** Writable tmpfs mounts: path → size in bytes. */
  tmpfs: Schema28.Record(Schema28.String, PositiveInt2),
  /** The user the sandbox runs as (`uid:gid`). */
  user: Schema28.String
});
var PoolSize = Schema28.Struct({
  min: NonNegativeInt,
  max: PositiveInt2,
  prewarm: NonNegativeInt,
  idleTtlMillis: Schema28.optionalKey(Millis),
  globalMax: Schema28.optionalKey(PositiveInt2)
});
var Timeouts = Schema28.Struct({
  acquireMillis: Millis,
  startMillis: Millis,
  resetMillis: Millis,
  healthMillis: Millis,
  healthIntervalMillis: Schema28.optionalKey(Millis)
});
var ResourceSpec = Schema28.Struct({
  name: Schema28.NonEmptyString,
  kind: ResourceKind,
  image: Schema28.optionalKey(Schema28.NonEmptyString),
  factory: Schema28.optionalKey(Schema28.NonEmptyString),
  limits: Limits,
  pool: PoolSize,
  timeouts: Timeouts,
  resetPolicy: ResetPolicy,
  scope: SharingScope,
  healthCheckOnAcquire: Schema28.Boolean
}).check(
  Schema28.makeFilter((spec) => {
    const issues = [];
    if (spec.pool.min > spec.pool.max) issues.push(`pool.min (${spec.pool.min}) exceeds pool.max (${spec.pool.max})`);
    if (spec.pool.prewarm > spec.pool.max) {
      issues.push(`pool.prewarm (${spec.pool.prewarm}) exceeds pool.max (${spec.pool.max})`);
    }
    if (spec.kind === "docker" && spec.image === void 0) issues.push("a docker resource needs an image");
    return issues;
  })
);
var defaults = {
  limits: {
    network: "none",
    readOnlyRoot: true,
    tmpfs: { "/work": 64 * 1024 * 1024 },
    user: "65534:65534"
  },
  pool: { min: 0, max: 4, prewarm: 0 },
  timeouts: { acquireMillis: 3e4, startMillis: 3e4, resetMillis: 1e4, healthMillis: 5e3 },
  resetPolicy: "reset",
  scope: "chain",
  healthCheckOnAcquire: true
};
var Owner = Schema28.Struct({ chainId: Schema28.String, groupId: Schema28.String });
var LeaseTimeout = class extends Schema28.TaggedError()("LeaseTimeout", {
  waitedMillis: Schema28.Number
}) {
  get isRetryable() {
    return true;
  }
};
var PoolClosed = class extends Schema28.TaggedError()("PoolClosed", {}) {
  get isRetryable() {
    return false;
  }
};
var StartFailed = class extends Schema28.TaggedError()("StartFailed", { message: Schema28.String }) {
  get isRetryable() {
    return true;
  }
};
var LeaseLost = class extends Schema28.TaggedError()("LeaseLost", {
  slot: Schema28.Int,
  token: Schema28.Int
}) {
  get isRetryable() {
    return true;
  }
};
var CoordinatorUnavailable = class extends Schema28.TaggedError()("CoordinatorUnavailable", {
  message: Schema28.String
}) {
  get isRetryable() {
    return true;
  }
};
var LeaseErrorReason = Schema28.Union([LeaseTimeout, PoolClosed, StartFailed, LeaseLost, CoordinatorUnavailable]);
var LeaseError = class extends Schema28.TaggedError()("LeaseError", {
  resource: Schema28.String,
  reason: LeaseErrorReason
}) {
  get isRetryable() {
    return this.reason.isRetryable;
  }
  get message() {
    const detail = this.reason.message === "" ? "" : `: ${this.reason.message}`;
    return `${this.resource}: ${this.reason._tag}${detail}`;
  }
};
var ResourceCoordinator = class extends Context7.Service()(
  "agentfly/src/Resource/ResourceCoordinator"
) {
};

// src/AgentTask.ts
import { Duration as Duration3, Effect as Effect28, Schema as Schema29 } from "effect";
var AgentCrashed = class extends Schema29.TaggedError()("AgentCrashed", {
  message: Schema29.String
}) {
};

// actors/RewardActor.ts
var make12 = (reward2, options) => Effect29.gen(function* () {
  const semaphore = options.concurrency === void 0 ? void 0 : yield* Semaphore2.make(options.concurrency);
  const timeout = options.timeout === void 0 ? void 0 : Duration4.fromInputUnsafe(options.timeout);
  const name2 = reward2.name;
  const error2 = (reason, message2) => new Reward_exports.RewardError({ reward: name2, reason, message: message2 });
  const applyFailure = (trajectory, failure) => ({
    trajectory: {
      ...trajectory,
      reward: 0,
      rewardStatus: options.onError === "zero" ? "scored" : "failed",
      masked: options.onError === "drop" ? true : trajectory.masked,
      metrics: {
        ...trajectory.metrics,
        [`reward/${name2}/error`]: 1,
        [`reward/${name2}/errors/${failure.reason}`]: 1
      }
    },
    error: failure
  });
  const score2 = Effect29.fnUntraced(function* (trajectory, scoreOptions) {
    let evaluation = reward2.evaluate({
      trajectory,
      row: scoreOptions?.row
    }).pipe(Effect29.provideContext(scoreOptions?.context ?? Context8.empty()));
    if (timeout !== void 0) {
      evaluation = Effect29.timeoutOrElse(evaluation, {
        duration: timeout,
        orElse: () => Effect29.fail(error2("Timeout", `reward "${name2}" timed out after ${Duration4.format(timeout)}`))
      });
    }
    if (semaphore !== void 0) evaluation = Semaphore2.withPermits(semaphore, 1)(evaluation);
    const exit = yield* Effect29.exit(evaluation);
    if (Exit2.isSuccess(exit)) {
      const outcome = exit.value;
      return {
        trajectory: {
          ...trajectory,
          reward: outcome._tag === "Scored" ? outcome.reward : 0,
          rewardStatus: outcome._tag === "Scored" ? "scored" : "not_applicable",
          metrics: { ...trajectory.metrics, ...outcome.metrics }
        },
        error: void 0
      };
    }
    const failure = Cause2.findErrorOption(exit.cause);
    if (Option6.isNone(failure) && !Cause2.hasDies(exit.cause)) {
      return yield* Effect29.failCause(exit.cause);
    }
    const rewardError = Option6.isSome(failure) ? failure.value : error2("Defect", `reward "${name2}" failed with an internal error`);
    yield* Effect29.logWarning(`reward ${name2} failed (${options.onError} policy)`, exit.cause);
    return applyFailure(trajectory, rewardError);
  });
  return { reward: reward2, score: score2 };
});

// actors/ToolActor.ts
import {
  Cause as Cause3,
  Clock as Clock3,
  Context as Context9,
  Duration as Duration5,
  Effect as Effect30,
  Exit as Exit3,
  Layer as Layer7,
  Option as Option7,
  Result as Result3,
  Schedule as Schedule3,
  Schema as Schema30,
  Semaphore as Semaphore3
} from "effect";
var ToolActor = class _ToolActor extends Context9.Service()("agentfly/actors/ToolActor") {
  static layer = (tools, options) => Layer7.effect(_ToolActor, make13(tools, options));
};
var isRetryableFailure = (f) => f._tag === "Timeout" || typeof f.error === "object" && f.error !== null && f.error.isRetryable === true;
var failureDetail = (error2, encoded) => {
  if (typeof error2 === "object" && error2 !== null) {
    const message2 = error2.message;
    if (typeof message2 === "string" && message2.length > 0) return message2;
  }
  if (typeof encoded === "string") return encoded;
  const json = JSON.stringify(encoded);
  return json === void 0 ? String(error2) : json;
};
var parseArguments = (raw) => {
  if (typeof raw !== "string") return { ok: true, value: raw ?? {} };
  if (raw.trim() === "") return { ok: true, value: {} };
  const decoded = decodeJson2(raw);
  return Exit3.isSuccess(decoded) ? { ok: true, value: decoded.value } : { ok: false, error: `arguments are not valid JSON (${raw.length > 80 ? raw.slice(0, 80) + "\u2026" : raw})` };
};
var decodeJson2 = Schema30.decodeUnknownExit(Schema30.fromJsonString(Schema30.Unknown));
var nowMs = Effect30.map(Clock3.currentTimeNanos, (n) => Number(n) / 1e6);
var defaultRetrySchedule = Schedule3.exponential("100 millis");
var retryAfterFailure = (attempt, policy) => Effect30.catch(attempt, (first) => {
  if (!isRetryableFailure(first)) return Effect30.fail(first);
  let replayed = false;
  return Effect30.retry(
    Effect30.suspend(() => replayed ? attempt : (replayed = true, Effect30.fail(first))),
    { ...policy, while: isRetryableFailure }
  );
});
var toolError = (call2, reason, detail, retryable) => new Tool_exports.ToolError({
  tool: call2.function.name,
  toolCallId: call2.id,
  reason,
  message: Tool_exports.errorText(reason, call2.function.name, detail),
  ...retryable === void 0 ? {} : { retryable }
});
var validate2 = (entry, call2, context) => {
  const args = parseArguments(call2.function.arguments);
  if (!args.ok) return toolError(call2, "DecodeError", args.error);
  const decoded = entry.decode(args.value);
  if (Exit3.isFailure(decoded)) {
    const detail = Option7.match(Cause3.findErrorOption(decoded.cause), {
      onNone: () => "invalid arguments",
      onSome: (e) => e.message.replace(/\n\s*/g, " ")
    });
    return toolError(call2, "DecodeError", detail);
  }
  for (const key2 of entry.tool.dependencies) {
    if (context === void 0 || Option7.isNone(Context9.getOption(context, key2))) {
      return toolError(call2, "MissingEnvironment", `the chain provides no ${key2.key}`);
    }
  }
  return { value: decoded.value };
};
var guarded2 = (entry, context, handler) => {
  let attempt = Effect30.mapError(
    Effect30.suspend(handler),
    (error2) => ({ _tag: "Failure", error: error2 })
  );
  if (context !== void 0) attempt = Effect30.provideContext(attempt, context);
  if (entry.timeout !== void 0) {
    attempt = Effect30.timeoutOrElse(attempt, {
      duration: entry.timeout,
      orElse: () => Effect30.fail({ _tag: "Timeout" })
    });
  }
  if (entry.semaphore !== void 0) attempt = Semaphore3.withPermits(entry.semaphore, 1)(attempt);
  if (entry.retry !== void 0) attempt = retryAfterFailure(attempt, entry.retry);
  return attempt;
};
var classify = (entry, call2, exit) => {
  const { tool } = entry;
  if (Exit3.isSuccess(exit)) {
    const encoded2 = entry.encode(exit.value);
    const text4 = Exit3.isSuccess(encoded2) ? Result3.try(() => tool.render !== void 0 ? tool.render(exit.value) : Tool_exports.renderValue(encoded2.value)) : void 0;
    return text4 === void 0 || Result3.isFailure(text4) ? toolError(call2, "InvalidResult", "") : { text: text4.success, value: exit.value };
  }
  const failure = Cause3.findErrorOption(exit.cause);
  if (Option7.isNone(failure)) return exit.cause;
  if (failure.value._tag === "Timeout") return toolError(call2, "Timeout", Duration5.format(entry.timeout));
  const value = failure.value.error;
  const encoded = Schema30.encodeUnknownExit(tool.failureSchema)(value);
  const detail = failureDetail(value, Exit3.isSuccess(encoded) ? encoded.value : void 0);
  return toolError(call2, "HandlerFailure", detail, isRetryableFailure(failure.value) ? true : void 0);
};
var make13 = (tools, options = {}) => Effect30.gen(function* () {
  const entries = /* @__PURE__ */ new Map();
  const defaultBudget = options.maxOutput ?? { chars: 4096 };
  const defaultTimeout = options.timeout === void 0 ? void 0 : Duration5.fromInputUnsafe(options.timeout);
  for (const tool of tools) {
    if (entries.has(tool.name)) {
      return yield* new Tool_exports.ToolError({
        tool: tool.name,
        toolCallId: "",
        reason: "DecodeError",
        message: `two tools are named "${tool.name}"`
      });
    }
    const decode2 = Schema30.decodeUnknownExit(tool.parametersSchema);
    entries.set(tool.name, {
      tool,
      decode: (u) => decode2(u, tool.strict ? { onExcessProperty: "error" } : void 0),
      encode: Schema30.encodeUnknownExit(tool.successSchema),
      semaphore: tool.concurrency === void 0 ? void 0 : yield* Semaphore3.make(tool.concurrency),
      timeout: tool.timeout ?? defaultTimeout,
      budget: tool.maxOutput ?? defaultBudget,
      retry: tool.retry === void 0 || tool.retry.times <= 0 ? void 0 : { times: tool.retry.times, schedule: tool.retry.schedule ?? defaultRetrySchedule }
    });
  }
  const available = `Available tools: ${tools.map((t) => t.name).join(", ") || "none"}.`;
  const stats = /* @__PURE__ */ new Map();
  const statsOf = (name2) => {
    let s = stats.get(name2);
    if (s === void 0) {
      s = { calls: 0, errors: 0, retries: 0, truncated: 0, latencySum: 0, latencyMax: 0, byReason: /* @__PURE__ */ new Map() };
      stats.set(name2, s);
    }
    return s;
  };
  const finish5 = (call2, statsKey, start3, outcome) => Effect30.map(nowMs, (end) => {
    const { text: text4, truncated } = Tool_exports.truncate(outcome.text, outcome.budget, options.tokenizer);
    const latencyMs = end - start3;
    const s = statsOf(statsKey);
    s.calls++;
    s.retries += Math.max(0, outcome.attempts - 1);
    s.latencySum += latencyMs;
    if (latencyMs > s.latencyMax) s.latencyMax = latencyMs;
    if (truncated) s.truncated++;
    if (outcome.error !== void 0) {
      s.errors++;
      s.byReason.set(outcome.error.reason, (s.byReason.get(outcome.error.reason) ?? 0) + 1);
    }
    const isError = outcome.error !== void 0;
    const terminal = !isError && outcome.terminal === true;
    return {
      toolCallId: call2.id,
      name: call2.function.name,
      message: isError ? { role: "tool", content: text4, tool_call_id: call2.id, name: call2.function.name, is_error: true } : { role: "tool", content: text4, tool_call_id: call2.id, name: call2.function.name },
      error: outcome.error,
      value: outcome.value,
      terminal,
      answer: terminal ? outcome.text : void 0,
      truncated,
      attempts: outcome.attempts,
      latencyMs
    };
  });
  const execute = Effect30.fnUntraced(function* (call2, turn) {
    const start3 = yield* nowMs;
    const entry = entries.get(call2.function.name);
    if (entry === void 0) {
      const error2 = toolError(call2, "UnknownTool", available);
      const outcome2 = { text: error2.message, error: error2, attempts: 0, budget: defaultBudget };
      return yield* finish5(call2, "_unknown", start3, outcome2);
    }
    const done = (outcome2) => finish5(call2, entry.tool.name, start3, { ...outcome2, budget: entry.budget });
    const params = validate2(entry, call2, turn?.context);
    if (params instanceof Tool_exports.ToolError) return yield* done({ text: params.message, error: params, attempts: 0 });
    let attempts = 0;
    const exit = yield* Effect30.exit(guarded2(entry, turn?.context, () => {
      attempts++;
      return entry.tool.handler(params.value, { toolCallId: call2.id });
    }));
    const outcome = classify(entry, call2, exit);
    if (Cause3.isCause(outcome)) {
      if (Cause3.hasInterruptsOnly(outcome)) return yield* Effect30.failCause(outcome);
      yield* Effect30.logWarning(`tool ${entry.tool.name} died`, outcome);
      const error2 = toolError(call2, "Defect", "");
      return yield* done({ text: error2.message, error: error2, attempts });
    }
    if (outcome instanceof Tool_exports.ToolError) {
      const result = yield* done({ text: outcome.message, error: outcome, attempts });
      if (outcome.reason === "HandlerFailure" && entry.tool.failureMode === "error") return yield* outcome;
      return result;
    }
    return yield* done({ ...outcome, terminal: entry.tool.terminal, attempts });
  });
  const executeTurn = Effect30.fnUntraced(function* (calls, turn) {
    const sequential = turn?.sequential ?? options.sequential ?? false;
    const results = calls.length === 1 ? [yield* execute(calls[0], turn)] : yield* Effect30.forEach(calls, (call2) => execute(call2, turn), { concurrency: sequential ? 1 : "unbounded" });
    let errors = 0;
    let formatErrors = 0;
    let answer2;
    for (const r of results) {
      if (r.error !== void 0) {
        errors++;
        if (r.error.isFormatError) formatErrors++;
      }
      if (r.terminal && answer2 === void 0) answer2 = r.answer;
    }
    return {
      results,
      messages: results.map((r) => r.message),
      answer: answer2,
      terminal: answer2 !== void 0,
      errors,
      formatErrors
    };
  });
  const metrics = Effect30.sync(() => {
    const out = {};
    for (const [name2, s] of stats) {
      const p = `tool/${name2}/`;
      out[p + "calls"] = s.calls;
      out[p + "errors"] = s.errors;
      out[p + "retries"] = s.retries;
      out[p + "truncated"] = s.truncated;
      out[p + "latency_mean_ms"] = s.calls === 0 ? 0 : s.latencySum / s.calls;
      out[p + "latency_max_ms"] = s.latencyMax;
      for (const [reason, n] of s.byReason) out[p + "errors/" + reason] = n;
    }
    return out;
  });
  return {
    tools,
    functionSchemas: tools.map(Tool_exports.functionSchema),
    execute,
    executeTurn,
    metrics
  };
});

// actors/TaskRuntime.ts
var taskError = (task2, reason) => (e) => new TaskError({
  task: task2.name,
  reason,
  message: typeof e === "object" && e !== null && "message" in e ? String(e.message) : String(e)
});
var environmentOf = (task2) => Effect31.gen(function* () {
  const source = task2.environment;
  if (source === void 0) return none;
  const own = task2.layer === void 0 ? Context10.empty() : yield* Layer8.build(task2.layer).pipe(Effect31.mapError(taskError(task2, "Environment")));
  const context = Context10.omit(Scope2.Scope)(Context10.merge(yield* Effect31.context(), own));
  const provider = isProvider(source) ? source : yield* source.pipe(
    Effect31.provideContext(context),
    Effect31.mapError(taskError(task2, "Environment"))
  );
  return make3(
    provider.sharing,
    (chain) => Effect31.provideContext(provider.acquire(chain), context),
    provider.stats
  );
});
var checkServices = (task2, environment) => Effect31.gen(function* () {
  if (task2.needs.length === 0) return;
  const scope = yield* Scope2.make();
  const acquired = yield* Effect31.exit(
    Scope2.provide(environment.acquire({ chainId: "probe", groupId: "probe", rowIndex: -1, row: {}, seed: 0 }), scope)
  );
  yield* Scope2.close(scope, Exit4.void);
  if (Exit4.isFailure(acquired)) {
    return yield* Effect31.failCause(acquired.cause).pipe(Effect31.mapError(taskError(task2, "Environment")));
  }
  const missing = missingServices(task2, acquired.value);
  if (missing.length > 0) {
    const what = task2.environment === void 0 ? "the task has no environment" : "its environment lacks them";
    return yield* new TaskError({
      task: task2.name,
      reason: "MissingServices",
      message: `task "${task2.name}": its tools or reward need ${missing.join(", ")}, but ${what}`
    });
  }
});
var make14 = (task2, options = {}) => Effect31.gen(function* () {
  const toolActor = yield* make13(task2.tools, {
    timeout: options.toolTimeout ?? Duration6.seconds(30)
  }).pipe(Effect31.mapError(taskError(task2, "Module")));
  const tools = toolsFromActor(toolActor);
  const reward2 = task2.reward === void 0 ? void 0 : rewardFromActor(yield* make12(task2.reward, { onError: "zero" }));
  const environment = yield* environmentOf(task2);
  yield* checkServices(task2, environment);
  return {
    task: task2,
    tools: options.renderTools === false ? { ...tools, schemas: [] } : tools,
    reward: reward2,
    environment,
    episode: task2.episode,
    policies: task2.policies,
    correct: task2.correct,
    environmentStats: environment.stats ?? Effect31.succeed({})
  };
});

// actors/Rollout.ts
var Limits2 = Schema31.Struct({
  numChains: Schema31.Int.check(Schema31.isGreaterThanOrEqualTo(1)),
  maxTurns: Schema31.Int.check(Schema31.isGreaterThanOrEqualTo(1)),
  maxConcurrentChains: Schema31.Int.check(Schema31.isGreaterThanOrEqualTo(1)),
  bufferSize: Schema31.Int.check(Schema31.isGreaterThanOrEqualTo(1)),
  maxContextTokens: Schema31.optionalKey(Schema31.Int.check(Schema31.isGreaterThanOrEqualTo(1))),
  rows: Schema31.Array(Schema31.Struct({ messages: Conversation })).check(Schema31.isMinLength(1))
});
var runTaskChat = (options) => Stream.unwrap(Effect32.map(taskOptions(options), runChat));
var taskOptions = (options) => Effect32.gen(function* () {
  const { task: task2 } = options;
  const runtime = yield* make14(task2, { toolTimeout: options.toolTimeout });
  const decodeFields2 = task2.row === void 0 ? void 0 : Schema31.decodeUnknownEffect(task2.row);
  const rows = [];
  for (const [index2, row] of options.rows.entries()) {
    const { question, messages, ...rest } = row;
    const fields = decodeFields2 === void 0 ? rest : { ...rest, ...yield* decodeFields2(rest) };
    const prompt = conversation(task2, {
      index: index2,
      line: index2 + 1,
      ...question === void 0 ? {} : { question },
      ...messages === void 0 ? {} : { messages },
      fields
    }, options.systemPrompt ?? task2.defaults.systemPrompt);
    rows.push({ ...fields, messages: prompt });
  }
  return {
    ...options,
    rows,
    tools: runtime.tools,
    reward: runtime.reward,
    environment: runtime.environment,
    episode: runtime.episode,
    policies: options.policies ?? runtime.policies
  };
});
var runChat = (options) => Stream.unwrap(Effect32.map(Effect32.service(ChatSampler), (chat) => runWith(options, { _tag: "Chat", chat })));
var runWith = (options, backend) => {
  const bufferSize = options.bufferSize ?? 2 * options.numChains;
  return Stream.callback(
    (queue) => Effect32.gen(function* () {
      const rows = options.rows ?? (options.messages === void 0 ? [] : [{ messages: options.messages }]);
      yield* Schema31.decodeUnknownEffect(Limits2)({
        numChains: options.numChains,
        maxTurns: options.maxTurns,
        maxConcurrentChains: options.maxConcurrentChains ?? 64,
        bufferSize,
        rows,
        ...options.maxContextTokens === void 0 ? {} : { maxContextTokens: options.maxContextTokens }
      });
      const runId = options.runId ?? (yield* Random.nextIntBetween(0, 2147483647)).toString(16);
      const stats = options.stats ?? makeStats();
      const config = {
        backend,
        format: options.format,
        tools: options.tools ?? noTools,
        reward: options.reward,
        environment: options.environment ?? none,
        episode: options.episode,
        sampling: options.sampling,
        maxTurns: options.maxTurns,
        maxContextTokens: options.maxContextTokens,
        policies: options.policies,
        retry: options.retry,
        stats
      };
      const restart = options.restart ?? Schedule4.max([Schedule4.spaced(100), Schedule4.recurs(2)]);
      const permits = yield* Semaphore4.make(options.maxConcurrentChains ?? 64);
      const chains2 = yield* FiberSet.make();
      let aborted = false;
      for (let rowIndex = 0; rowIndex < rows.length && !aborted; rowIndex++) {
        const row = rows[rowIndex];
        const { messages, ...fields } = row;
        const groupId = `${runId}-g${rowIndex}`;
        const group = makeCollector(groupId, rowIndex, options.numChains, stats);
        for (let chainIndex = 0; chainIndex < options.numChains && !aborted; chainIndex++) {
          yield* Semaphore4.take(permits, 1);
          const chainId = `${groupId}-c${chainIndex}`;
          const seed = options.sampling.seed;
          const spec = {
            trajectoryId: chainId,
            groupId,
            chainId,
            messages,
            rowIndex,
            // One world per group: every chain of a row starts its episode from the same seed.
            episodeSeed: (seed ?? 0) + rowIndex * options.numChains,
            ...Object.keys(fields).length === 0 ? {} : { row: fields }
          };
          const chainConfig = seed === void 0 ? config : {
            ...config,
            sampling: { ...config.sampling, seed: seed + rowIndex * options.numChains + chainIndex }
          };
          stats.chainsStarted++;
          stats.chainsInFlight++;
          yield* FiberSet.run(
            chains2,
            supervise(spec, chainConfig, restart).pipe(
              Effect32.flatMap((outcome) => group.deliver(chainIndex, outcome, queue)),
              Effect32.catch(
                (error2) => Effect32.suspend(() => {
                  aborted = true;
                  return Queue.fail(queue, error2);
                })
              ),
              Effect32.ensuring(Effect32.suspend(() => {
                stats.chainsInFlight--;
                stats.chainsFinished++;
                return Semaphore4.release(permits, 1);
              }))
            )
          );
        }
      }
      yield* FiberSet.awaitEmpty(chains2);
      yield* Queue.end(queue);
    }),
    { bufferSize, strategy: "suspend" }
  );
};
var supervise = (spec, config, restart) => run(spec, config).pipe(
  Effect32.sandbox,
  Effect32.retry({
    schedule: Schedule4.tap(restart, () => Effect32.sync(() => config.stats.restarts++)),
    while: (cause) => !Cause4.hasFails(cause) && Cause4.hasDies(cause)
  }),
  Effect32.catch(
    (cause) => Cause4.hasFails(cause) || !Cause4.hasDies(cause) ? Effect32.failCause(cause) : Effect32.sync(() => defectOutcome(spec, config, cause))
  )
);
var defectOutcome = (spec, config, cause) => {
  config.stats.errors.set("ChainDefect", (config.stats.errors.get("ChainDefect") ?? 0) + 1);
  config.stats.terminations.set("error", (config.stats.terminations.get("error") ?? 0) + 1);
  const policy = policyFor("ChainDefect", config.policies);
  return {
    trajectory: {
      trajectoryId: spec.trajectoryId,
      groupId: spec.groupId,
      chainId: spec.chainId,
      messages: spec.messages,
      segments: [],
      termination: "error",
      reward: 0,
      rewardStatus: "failed",
      metrics: {},
      trainable: true,
      masked: true,
      ...spec.row === void 0 ? {} : { row: spec.row },
      error: `ChainDefect: ${String(Cause4.squash(cause))}`,
      errorReason: "ChainDefect"
    },
    dropGroup: policy === "drop_group"
  };
};
var makeCollector = (groupId, rowIndex, size2, stats) => {
  const outcomes = new Array(size2);
  let remaining = size2;
  return {
    deliver: (chainIndex, outcome, queue) => Effect32.gen(function* () {
      outcomes[chainIndex] = outcome;
      const last = --remaining === 0;
      yield* Queue.offer(queue, { _tag: "Trajectory", rowIndex, trajectory: outcome.trajectory });
      if (!last) return;
      const done = outcomes;
      if (done.some((o) => o.dropGroup)) {
        const reasons = done.flatMap(
          (o) => o.dropGroup && o.trajectory.error !== void 0 ? [o.trajectory.error] : []
        );
        stats.groupsDropped++;
        yield* Queue.offer(queue, { _tag: "GroupDropped", groupId, rowIndex, reasons });
      } else {
        stats.groupsEmitted++;
        yield* Queue.offer(queue, {
          _tag: "Group",
          group: { groupId, rowIndex, trajectories: done.map((o) => o.trajectory) }
        });
      }
    })
  };
};

// environments/search/SearchIndex.ts
import { Context as Context11, Effect as Effect33, Layer as Layer9 } from "effect";
import MiniSearch from "minisearch";
var SearchIndex = class extends Context11.Service()("agentfly/environments/search/SearchIndex") {
};
var titleBoost = 2;
var make15 = (passages2) => {
  const index2 = new MiniSearch({
    fields: ["title", "text"],
    storeFields: [],
    searchOptions: { boost: { title: titleBoost } }
  });
  index2.addAll(passages2.map((p, id) => ({ id, title: p.title ?? "", text: p.text })));
  return SearchIndex.of({
    size: passages2.length,
    search: (query, k) => index2.search(query).slice(0, k).map((hit) => passages2[hit.id])
  });
};
var layer2 = (passages2) => Layer9.effect(SearchIndex, Effect33.map(passages2, make15));

// environments/search/World.ts
import { Effect as Effect34, Schema as Schema32 } from "effect";
var defaults2 = { seed: 2026, passages: 1e4 };
var hops = {
  born: 1,
  founder: 1,
  country: 1,
  founderBorn: 2,
  bornCountry: 2
};
var WorldError = class extends Schema32.TaggedError()("WorldError", { message: Schema32.String }) {
};
var consonants = "bdfgklmnprstvz";
var vowels = "aeiou";
var finals = ["", "n", "r", "s", "l"];
var jobs = [
  "baker",
  "painter",
  "farmer",
  "doctor",
  "pilot",
  "writer",
  "singer",
  "tailor",
  "sailor",
  "judge",
  "nurse",
  "chef",
  "miner",
  "poet",
  "actor",
  "coach",
  "clerk",
  "guard",
  "smith",
  "diver"
];
var reserved = [
  ...jobs,
  "was",
  "born",
  "works",
  "founded",
  "based",
  "city",
  "country",
  "where",
  "who",
  "which",
  "founder",
  "the",
  "of",
  "in",
  "is",
  "as",
  "an",
  "by"
];
var words = (next, used) => (syllables, final) => {
  const pick = (s) => s[Math.floor(next() * s.length)];
  for (; ; ) {
    let w = "";
    for (let i = 0; i < syllables; i++) w += pick(consonants) + pick(vowels);
    if (final) w += finals[Math.floor(next() * finals.length)];
    if (used.has(w)) continue;
    used.add(w);
    return w[0].toUpperCase() + w.slice(1);
  }
};
var shuffle = (xs, next) => {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [xs[i], xs[j]] = [xs[j], xs[i]];
  }
  return xs;
};
var passagesPerPerson = 4.25;
var make16 = (options) => {
  const next = mulberry32(options.seed);
  const word = words(next, new Set(reserved));
  const people = Math.max(8, Math.ceil(options.passages / passagesPerPerson));
  const cityCount = Math.max(2, Math.ceil(people / 4));
  const side = Math.max(4, Math.ceil(1.5 * Math.sqrt(people)));
  const firsts = Array.from({ length: side }, () => word(2, false));
  const lasts = Array.from({ length: side }, () => word(2, false));
  const countries = Array.from({ length: 24 }, () => word(2, false) + "ria");
  const cities = Array.from({ length: cityCount }, () => ({
    name: word(2, true),
    country: countries[Math.floor(next() * countries.length)]
  }));
  const pairs = /* @__PURE__ */ new Set();
  const persons = [];
  while (persons.length < people) {
    const name2 = `${firsts[Math.floor(next() * side)]} ${lasts[Math.floor(next() * side)]}`;
    if (pairs.has(name2)) continue;
    pairs.add(name2);
    persons.push({
      name: name2,
      city: cities[Math.floor(next() * cityCount)].name,
      job: jobs[Math.floor(next() * jobs.length)]
    });
  }
  const founders = shuffle(persons.map((p) => p.name), next);
  const companies = founders.map((founder) => ({
    name: word(3, false),
    founder,
    city: cities[Math.floor(next() * cityCount)].name
  }));
  return { seed: options.seed, people: persons, companies, cities, countries };
};
var passages = (world2) => {
  const out = [];
  const add = (title, text4) => out.push({ id: String(out.length), title, text: text4 });
  for (const p of world2.people) {
    add(p.name, `${p.name} was born in ${p.city}.`);
    add(p.name, `${p.name} works as ${/^[aeiou]/.test(p.job) ? "an" : "a"} ${p.job}.`);
  }
  for (const c of world2.companies) {
    add(c.name, `${c.name} was founded by ${c.founder}.`);
    add(c.name, `${c.name} is based in ${c.city}.`);
  }
  for (const t of world2.cities) add(t.name, `${t.name} is a city in ${t.country}.`);
  return out;
};
var templates2 = {
  born: (p) => `Where was ${p} born?`,
  founder: (c) => `Who founded ${c}?`,
  country: (t) => `Which country is ${t} in?`,
  founderBorn: (c) => `Where was the founder of ${c} born?`,
  bornCountry: (p) => `Which country was ${p} born in?`
};
var parse5 = (question) => {
  const patterns = [
    ["founderBorn", /^Where was the founder of (.+) born\?$/],
    ["bornCountry", /^Which country was (.+) born in\?$/],
    ["born", /^Where was (.+) born\?$/],
    ["founder", /^Who founded (.+)\?$/],
    ["country", /^Which country is (.+) in\?$/]
  ];
  for (const [kind, re] of patterns) {
    const m = re.exec(question.trim());
    if (m !== null) return { kind, name: m[1] };
  }
  return void 0;
};
var ask = (world2, kind, subject) => {
  const question = templates2[kind](subject);
  const base = { question, kind, hops: hops[kind] };
  switch (kind) {
    case "born":
      return { ...base, answer: world2.person.get(subject).city, queries: [subject] };
    case "founder":
      return { ...base, answer: world2.company.get(subject).founder, queries: [subject] };
    case "country":
      return { ...base, answer: world2.city.get(subject).country, queries: [subject] };
    case "founderBorn": {
      const founder = world2.company.get(subject).founder;
      return { ...base, answer: world2.person.get(founder).city, queries: [subject, founder] };
    }
    case "bornCountry": {
      const city = world2.person.get(subject).city;
      return { ...base, answer: world2.city.get(city).country, queries: [subject, city] };
    }
  }
};
var questions = (world2, options) => Effect34.suspend(() => {
  const next = mulberry32(options.seed);
  const lookup = {
    person: new Map(world2.people.map((p) => [p.name, p])),
    company: new Map(world2.companies.map((c) => [c.name, c])),
    city: new Map(world2.cities.map((t) => [t.name, t]))
  };
  const pools = {
    born: shuffle(world2.people.map((p) => p.name), next),
    founder: shuffle(world2.companies.map((c) => c.name), next),
    country: shuffle(world2.cities.map((t) => t.name), next),
    founderBorn: shuffle(world2.companies.map((c) => c.name), next),
    bornCountry: shuffle(world2.people.map((p) => p.name), next)
  };
  const allowed = (kinds) => kinds.filter((k) => options.kinds?.includes(k) ?? true);
  const byHops = {
    1: allowed(["born", "founder", "country"]),
    2: allowed(["founderBorn", "bornCountry"])
  };
  if (byHops[1].length + byHops[2].length === 0) {
    const known = Object.keys(hops).join(", ");
    return Effect34.fail(new WorldError({ message: `no kind of question to ask (known: ${known})` }));
  }
  const draw = () => {
    const drawn = byHops[next() < options.twoHop ? 2 : 1];
    const kinds = drawn.length > 0 ? drawn : byHops[1].length > 0 ? byHops[1] : byHops[2];
    const first = Math.floor(next() * kinds.length);
    for (let i = 0; i < kinds.length; i++) {
      const kind = kinds[(first + i) % kinds.length];
      const subject = pools[kind].pop();
      if (subject !== void 0) return ask(lookup, kind, subject);
    }
    return void 0;
  };
  const out = {};
  for (const split2 of Object.keys(options.counts)) {
    out[split2] = [];
    for (let i = 0; i < options.counts[split2]; i++) {
      const q = draw();
      if (q === void 0) {
        return Effect34.fail(new WorldError({ message: `the world of seed ${world2.seed} ran out of subjects at ${split2} question ${i + 1}: ask fewer questions or build more passages` }));
      }
      out[split2].push(q);
    }
  }
  return Effect34.succeed(out);
});

// environments/search/SearchOracle.ts
var escape2 = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
var relations = {
  born: (name2) => new RegExp(`(?:^|\\n)${escape2(name2)} was born in ([^.\\n]+)\\.`),
  founder: (name2) => new RegExp(`(?:^|\\n)${escape2(name2)} was founded by ([^.\\n]+)\\.`),
  country: (name2) => new RegExp(`(?:^|\\n)${escape2(name2)} is a city in ([^.\\n]+)\\.`)
};
var chains = {
  born: ["born"],
  founder: ["founder"],
  country: ["country"],
  founderBorn: ["founder", "born"],
  bornCountry: ["born", "country"]
};
var questionOf = (messages) => text3(messages.find((m) => m.role === "user"));
var observations = (messages) => {
  const ids = new Set(
    messages.flatMap(
      (m) => m.role === "assistant" ? (m.tool_calls ?? []).filter((c) => c.function.name === "search").map((c) => c.id) : []
    )
  );
  return messages.flatMap((m) => m.role === "tool" && ids.has(m.tool_call_id) ? [text3(m)] : []);
};
var plan = (messages) => {
  const parsed = parse5(questionOf(messages));
  if (parsed === void 0) return { answer: "unknown", observation: "" };
  const read4 = observations(messages);
  let name2 = parsed.name;
  for (const [hop, relation] of chains[parsed.kind].entries()) {
    const observation = read4[hop];
    if (observation === void 0) return { search: name2 };
    const found = relations[relation](name2).exec(observation)?.[1];
    if (found === void 0) return { answer: "unknown", observation };
    name2 = found;
  }
  return { answer: name2, observation: read4.at(-1) };
};
var oracle = (messages) => {
  const step3 = plan(messages);
  return "search" in step3 ? { toolCalls: [call(messages, "search", { query: step3.search })] } : { toolCalls: [call(messages, "answer", { answer: step3.answer })] };
};

// environments/search/SearchTask.ts
import { NodeFileSystem } from "@effect/platform-node";
import { Effect as Effect41, Schema as Schema37 } from "effect";

// environments/answer/Answer.ts
import { Effect as Effect35, Schema as Schema33 } from "effect";
var make17 = (name2, description) => Tool_exports.make(name2, {
  description,
  parameters: Schema33.Struct({
    answer: Schema33.Union([Schema33.String, Schema33.Finite]).annotate({ description: "The final answer" })
  }),
  success: Schema33.String,
  terminal: true,
  handler: ({ answer: answer2 }) => Effect35.succeed(String(answer2).trim())
});
var answer = make17("answer", "Give your final answer. This ends the episode.");

// environments/rewards/Qa.ts
import { Effect as Effect36, Schema as Schema34 } from "effect";
var normalizeAnswer = (text4) => text4.toLowerCase().replace(/[\p{P}\p{S}]/gu, " ").replace(/\b(a|an|the)\b/g, " ").split(/\s+/).filter((t) => t.length > 0).join(" ");
var prediction = (response) => [...response.matchAll(/<answer>([\s\S]*?)<\/answer>/g)].at(-1)?.[1] ?? response;
var tokenF1 = (predicted, reference) => {
  const p = normalizeAnswer(predicted).split(" ").filter((t) => t !== "");
  const r = normalizeAnswer(reference).split(" ").filter((t) => t !== "");
  if (p.length === 0 || r.length === 0) {
    const same = p.length === r.length ? 1 : 0;
    return { f1: same, precision: same, recall: same };
  }
  const counts = /* @__PURE__ */ new Map();
  for (const t of r) counts.set(t, (counts.get(t) ?? 0) + 1);
  let common = 0;
  for (const t of p) {
    const n = counts.get(t) ?? 0;
    if (n > 0) {
      common++;
      counts.set(t, n - 1);
    }
  }
  if (common === 0) return { f1: 0, precision: 0, recall: 0 };
  const precision = common / p.length;
  const recall = common / r.length;
  return { f1: 2 * precision * recall / (precision + recall), precision, recall };
};
var References = Schema34.Struct({
  answer: Schema34.Union([Schema34.String, Schema34.NonEmptyArray(Schema34.String)])
});
var referencesOf = (row) => typeof row.answer === "string" ? [row.answer] : row.answer;
var exactMatch = Reward_exports.make("exactMatch", {
  row: References,
  score: ({ response, row }) => Effect36.sync(() => {
    const p = normalizeAnswer(prediction(response));
    const em = referencesOf(row).some((r) => normalizeAnswer(r) === p) ? 1 : 0;
    return { reward: em, metrics: { em } };
  })
});
var f1 = Reward_exports.make("f1", {
  row: References,
  score: ({ response, row }) => Effect36.sync(() => {
    const predicted = prediction(response);
    const best = referencesOf(row).map((r) => tokenF1(predicted, r)).reduce((a, b) => b.f1 > a.f1 ? b : a);
    const em = referencesOf(row).some((r) => normalizeAnswer(r) === normalizeAnswer(predicted)) ? 1 : 0;
    return { reward: best.f1, metrics: { f1: best.f1, em, precision: best.precision, recall: best.recall } };
  })
});

// environments/rewards/ToolCallFormat.ts
import { Effect as Effect37 } from "effect";
var countTurns = (trajectory, marker2 = "<tool_call>") => {
  let turns2 = 0;
  let toolTurns = 0;
  let wellFormed = 0;
  let formatErrors = 0;
  let current;
  const close = () => {
    if (current === void 0 || !current.attempted) return;
    toolTurns++;
    if (!current.malformed && current.ids.size > 0) wellFormed++;
  };
  for (const m of trajectory.messages) {
    if (m.role === "assistant") {
      close();
      turns2++;
      const calls = m.tool_calls ?? [];
      current = {
        ids: new Set(calls.map((c) => c.id)),
        attempted: calls.length > 0 || Message_exports.text(m.content).includes(marker2),
        malformed: false
      };
    } else if (m.role === "tool" && m.is_error === true && current !== void 0) {
      if (Tool_exports.formatErrorOf(Message_exports.text(m.content)) !== void 0 || !current.ids.has(m.tool_call_id)) {
        formatErrors++;
        current.attempted = true;
        current.malformed = true;
      }
    }
  }
  close();
  return { turns: turns2, toolTurns, wellFormed, formatErrors };
};
var make18 = (marker2) => Reward_exports.make("toolCallFormat", {
  score: ({ trajectory }) => Effect37.sync(() => {
    const c = countTurns(trajectory, marker2);
    return {
      reward: c.toolTurns === 0 ? 0 : c.wellFormed / c.toolTurns,
      metrics: { turns: c.turns, tool_turns: c.toolTurns, well_formed: c.wellFormed, format_errors: c.formatErrors }
    };
  })
});
var toolCallFormat = make18("<tool_call>");

// environments/search/Corpus.ts
import { Effect as Effect38, FileSystem as FileSystem11, Schema as Schema35 } from "effect";
var Line = Schema35.Struct({
  id: Schema35.optionalKey(Schema35.Union([Schema35.String, Schema35.Finite])),
  title: Schema35.optionalKey(Schema35.String),
  text: Schema35.optionalKey(Schema35.String),
  contents: Schema35.optionalKey(Schema35.String)
});
var CorpusError = class extends Schema35.TaggedError()("CorpusError", {
  path: Schema35.String,
  line: Schema35.optionalKey(Schema35.Int),
  message: Schema35.String
}) {
};
var corpusError = (path, detail, line) => new CorpusError({
  path,
  ...line === void 0 ? {} : { line },
  message: `corpus ${path}${line === void 0 ? "" : `, line ${line}`}: ${detail}`
});
var fromContents = (contents) => {
  const m = /^"([^"\n]*)"\n([\s\S]*)$/.exec(contents);
  return m === null ? { text: contents } : { title: m[1], text: m[2] };
};
var decodeLine = Schema35.decodeUnknownExit(Schema35.fromJsonString(Line));
var parseLine = (text4, position) => {
  const decoded = decodeLine(text4);
  if (decoded._tag === "Failure") return "not a JSON object with `text` or `contents`";
  const line = decoded.value;
  const body2 = line.text !== void 0 ? { ...line.title === void 0 ? {} : { title: line.title }, text: line.text } : line.contents !== void 0 ? fromContents(line.contents) : void 0;
  if (body2 === void 0) return "a passage needs `text` or `contents`";
  if (body2.text.trim() === "") return "the passage's text is empty";
  return { id: line.id === void 0 ? String(position) : String(line.id), ...body2 };
};
var read3 = Effect38.fn("Corpus.read")(function* (path) {
  const fs = yield* FileSystem11.FileSystem;
  const content = yield* fs.readFileString(path).pipe(
    Effect38.mapError((e) => corpusError(path, `cannot read it (${e.message})`))
  );
  const passages2 = [];
  for (const [i, text4] of content.split("\n").entries()) {
    if (text4.trim() === "") continue;
    const passage = parseLine(text4, passages2.length);
    if (typeof passage === "string") return yield* corpusError(path, passage, i + 1);
    passages2.push(passage);
  }
  if (passages2.length === 0) return yield* corpusError(path, "no passage in it");
  return passages2;
});

// environments/search/SearchSession.ts
import { Context as Context12, Effect as Effect39, Layer as Layer10, Ref as Ref3 } from "effect";
var defaults3 = { k: 2, maxK: 5, maxSearches: 4, passageChars: 120, observationChars: 400 };
var SearchSession = class extends Context12.Service()("agentfly/environments/search/SearchSession") {
};
var cut = (text4, max) => text4.length <= max ? text4 : `${text4.slice(0, Math.max(0, max - 3))}...`;
var shown = (passage) => passage.title === void 0 || passage.title === "" || passage.text.startsWith(passage.title) ? passage.text : `${passage.title}: ${passage.text}`;
var render3 = (hits, options) => {
  if (hits.length === 0) return "No results.";
  const lines = hits.map((p) => cut(shown(p).replace(/\s+/g, " "), options.passageChars));
  return cut(lines.join("\n"), options.observationChars);
};
var invalid = (message2) => new EnvError({ env: "search", method: "search", reason: "InvalidAction", message: message2 });
var make19 = (index2, options = defaults3) => Effect39.map(Ref3.make({ queries: [] }), (state) => SearchSession.of({
  search: (query, k) => Effect39.flatMap(Ref3.get(state), (s) => {
    const q = query.trim();
    if (!/[\p{L}\p{N}]/u.test(q)) return Effect39.fail(invalid("empty query: search for a name"));
    const top = k ?? options.k;
    if (!Number.isInteger(top) || top < 1 || top > options.maxK) {
      return Effect39.fail(invalid(`k must be a whole number from 1 to ${options.maxK}`));
    }
    if (s.queries.length >= options.maxSearches) {
      return Effect39.fail(invalid(`no searches left (${options.maxSearches} per episode): answer now`));
    }
    return Effect39.as(Ref3.set(state, { queries: [...s.queries, q] }), render3(index2.search(q, top), options));
  }),
  state: Ref3.get(state)
}));
var layer3 = (options = defaults3) => Layer10.effect(SearchSession, Effect39.flatMap(SearchIndex, (index2) => make19(index2, options)));

// environments/search/SearchTool.ts
import { Effect as Effect40, Schema as Schema36 } from "effect";
var make20 = (maxK) => Tool_exports.make("search", {
  description: "Search the passages; returns the top k of them.",
  parameters: Schema36.Struct({
    query: Schema36.String.annotate({ description: "Words to look for, e.g. a name" }),
    k: Schema36.optionalKey(
      Schema36.Int.check(Schema36.isBetween({ minimum: 1, maximum: maxK })).annotate({ description: "How many passages" })
    )
  }),
  success: Schema36.String,
  failure: EnvError,
  dependencies: [SearchSession],
  handler: ({ query, k }) => Effect40.flatMap(SearchSession, (session) => session.search(query, k))
});
var search = make20(5);

// environments/search/SearchTask.ts
var Count = Schema37.Int.check(Schema37.isGreaterThanOrEqualTo(1));
var Options = Schema37.Struct({
  seed: Schema37.optionalKey(Schema37.Int),
  passages: Schema37.optionalKey(Count),
  corpus: Schema37.optionalKey(Schema37.String),
  k: Schema37.optionalKey(Count),
  maxK: Schema37.optionalKey(Count),
  maxSearches: Schema37.optionalKey(Count),
  passageChars: Schema37.optionalKey(Count),
  observationChars: Schema37.optionalKey(Count),
  reward: Schema37.optionalKey(Schema37.Literals(["em", "f1"])),
  toolCallFormat: Schema37.optionalKey(Schema37.Number.check(Schema37.isGreaterThanOrEqualTo(0)))
});
var systemPrompt = "Search, then answer.";
var passagesOf = (options) => options.corpus !== void 0 ? read3(options.corpus).pipe(Effect41.provide(NodeFileSystem.layer)) : Effect41.sync(
  () => passages(make16({
    seed: options.seed ?? defaults2.seed,
    passages: options.passages ?? defaults2.passages
  }))
);
var answered = (qa) => make7("answer", {
  dependencies: [SearchSession],
  score: ({ trajectory }) => Effect41.gen(function* () {
    const done = trajectory.termination === "answer";
    const outcome = yield* qa.evaluate({ trajectory, response: done ? finalResponse(trajectory) : "" });
    const { queries } = yield* (yield* SearchSession).state;
    const metrics = { ...outcome.metrics, answered: done ? 1 : 0, searches: queries.length };
    return outcome._tag === "Scored" ? { reward: outcome.reward, metrics } : notApplicable(outcome.reason);
  })
});
var reward = (options) => {
  const qa = answered(options.reward === "f1" ? f1 : exactMatch);
  const w = options.toolCallFormat ?? 0;
  return w === 0 ? qa : combine(`qa + ${w}\xB7toolCallFormat`, [
    { reward: qa, weight: 1 },
    { reward: toolCallFormat, weight: w }
  ]);
};
var correct = (t) => (t.metrics["reward/exactMatch/em"] ?? t.metrics["reward/f1/em"]) === 1;
var make21 = (options = {}, index2 = layer2(passagesOf(options))) => {
  const session = {
    k: options.k ?? defaults3.k,
    maxK: options.maxK ?? defaults3.maxK,
    maxSearches: options.maxSearches ?? defaults3.maxSearches,
    passageChars: options.passageChars ?? defaults3.passageChars,
    observationChars: options.observationChars ?? defaults3.observationChars
  };
  return make4("search", {
    description: "Questions of one and two hops answered by searching a corpus of passages",
    row: Schema37.Struct({ answer: Schema37.Union([Schema37.String, Schema37.NonEmptyArray(Schema37.String)]) }),
    tools: [make20(session.maxK), answer],
    reward: reward(options),
    // The index is built once per run (the task's layer); each chain gets its own session over it.
    layer: index2,
    environment: perChain(layer3(session)),
    correct,
    defaults: { systemPrompt, renderTools: false, maxTurns: 4, maxNewTokens: 64, maxContextTokens: 768 }
  });
};
var task = withOptions("search", Options, (options) => make21(options));

// prof-search.ts
var bare = (rows) => Effect42.gen(function* () {
  let steps = 0;
  let solved = 0;
  for (const row of rows) {
    const session = yield* make19(index);
    const messages = [
      { role: "system", content: systemPrompt },
      { role: "user", content: row.question }
    ];
    for (let turn = 0; turn < 4; turn++) {
      const step3 = plan(messages);
      const id = `call_${turn}`;
      steps++;
      if ("answer" in step3) {
        if (normalizeAnswer(step3.answer) === normalizeAnswer(row.answer)) solved++;
        break;
      }
      const observation = yield* session.search(step3.search);
      messages.push(
        { role: "assistant", content: "", tool_calls: [{ id, type: "function", function: { name: "search", arguments: { query: step3.search } } }] },
        { role: "tool", tool_call_id: id, name: "search", content: observation }
      );
    }
  }
  return steps;
});
var byteFormat = fromTemplate({
  tokenizer: Effect42.runSync(make(tokenizerJson(), tokenizerConfig(""))),
  template: builtinTemplate("qwen2.5")
});
var messagesFormat = {
  stopTokenIds: [],
  start: (messages) => Effect42.sync(() => {
    const history = [...messages];
    return {
      length: () => 0,
      promptTokenIds: () => [],
      appendSampled: () => Effect42.die("messagesFormat: chat mode only"),
      appendAssistant: (message2) => Effect42.sync(() => {
        history.push(message2);
        return { message: message2, toolCalls: message2.tool_calls ?? [], parseErrors: [], complete: true };
      }),
      appendObservations: (observations2) => Effect42.sync(() => void history.push(...observations2)),
      messages: () => [...history],
      segments: () => []
    };
  })
};
var world = make16({ seed: defaults2.seed, passages: 1e4 });
var index = make15(passages(world));
var now = () => performance.now();
await Effect42.runPromise(Effect42.gen(function* () {
  const { heldOut } = yield* questions(world, { seed: 7, twoHop: 0.3, counts: { heldOut: 640, probe: 10 } });
  const rows = heldOut.map((q) => ({ question: q.question, answer: q.answer }));
  const task2 = make21({}, Layer11.succeed(SearchIndex, index));
  const reps = Number(process.env.REPS ?? 6);
  for (let r = 0; r < reps; r++) {
    const t = now();
    const events = yield* runTaskChat({
      task: task2,
      rows,
      numChains: 1,
      maxTurns: 4,
      maxConcurrentChains: 64,
      sampling: { temperature: 1, maxTokens: 64 },
      format: process.env.FMT === "messages" ? messagesFormat : byteFormat
    }).pipe(Stream2.runCollect, Effect42.provide(layer(oracle)));
    const ms = now() - t;
    const tr = events.flatMap((e) => e._tag === "Trajectory" ? [e.trajectory] : []);
    const steps = tr.reduce((n, t3) => n + t3.messages.filter((m) => m.role === "tool").length, 0);
    const t2 = now();
    const bs = yield* bare(heldOut);
    const bms = now() - t2;
    console.log(`bare ${(bms * 1e3 / bs).toFixed(0)} us/step ratio ${(bms / bs / (ms / steps)).toFixed(3)}`);
    console.log(`round ${r}: ${steps} steps ${ms.toFixed(0)} ms ${(ms * 1e3 / steps).toFixed(0)} us/step`);
  }
}));
