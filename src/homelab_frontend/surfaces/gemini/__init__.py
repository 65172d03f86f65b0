"""The Gemini API surface (Google GenAI SDKs, Gemini CLI): generateContent and friends."""
