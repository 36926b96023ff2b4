// What an agent function of the gateway's tasks has at hand: its episode's client, and what its code built.
import Anthropic from "@anthropic-ai/sdk"
import type { MessageParam, Tool as AnthropicTool } from "@anthropic-ai/sdk/resources/messages"
import { Agent, OpenAIResponsesModel, type Tool as AgentsTool } from "@openai/agents"
import OpenAI from "openai"
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions"
import type { ResponseInput, Tool as ResponsesTool } from "openai/resources/responses/responses"
declare const client: { readonly baseURL: string; readonly apiKey: string; readonly model: string }
declare const name: string
declare const instructions: string
declare const system: string
declare const input: ResponseInput
declare const messages: Array<ChatCompletionMessageParam> & Array<MessageParam>
declare const tools: Array<ChatCompletionTool> & Array<ResponsesTool> & Array<AnthropicTool>
declare const agentTools: Array<AgentsTool>
