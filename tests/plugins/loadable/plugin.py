from clawsup.sandbox.api import hookimpl


@hookimpl
def clawsup_register(api):
    api.register_tool(name="loadable_ok", description="Answers ok.", handler=lambda args: "ok")
