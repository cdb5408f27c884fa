"""Documents shared by the restart workflows (workflows/) and their activities (activities/).

Neither side owns them, so neither imports the other for them: ``restart`` holds the workflows'
inputs, outputs and progress/result documents, ``evidence`` the canary analysis's policy, evidence
and samples. Imported by workflow code (through the sandbox's pass-through), so: stdlib + pydantic
only, and never the router (workflows never import router internals).
"""
