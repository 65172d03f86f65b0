"""The OpenAI Chat Completions surface: parse the dialect into canonical, relay or assemble the answer."""
