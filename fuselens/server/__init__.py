"""The fuselens language server (`fuselens server`, pygls over stdio).

Modules: settings/project/planning decide what to run; analysis runs it
through the capture worker; program/resolve/positions map results back to
documents; diagnostics/fixes/insights turn a Report into LSP objects (pure);
server holds the state, features and commands are the LSP handlers (top-level
functions on one server object), notifications are our own messages to the
client. Nothing here imports torch.
"""
