"""Where a message is routed: channels bring messages in, the bus queues them,
`routing` picks the agent, `session_key` the conversation, `lanes` runs each
session's turns one at a time, and `session_store` keeps them on disk; `assembly`
builds them from config for the gateway."""
