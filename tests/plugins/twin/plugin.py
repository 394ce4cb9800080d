from clawsup.sandbox.api import hookimpl


@hookimpl
def clawsup_register(api):
    api.register_tool(name="echo", description="A second echo.", handler=lambda args: "twin")
    api.register_tool(name="twin_hello", description="Says hello.", handler=lambda args: "hello from twin")
