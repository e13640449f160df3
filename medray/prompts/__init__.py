"""How models are prompted: spec (the PromptSpec contract), text (every prompt text and the
one chat-template site), tokens (token assembly and budgets), strategies (long-context
strategies), render (`medray data prompt`)."""
