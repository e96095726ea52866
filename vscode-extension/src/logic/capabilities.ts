// Client capabilities the extension adjusts before `initialize`. Pure.

/** The parts of LSP ClientCapabilities touched here. */
export interface CapabilitiesLike {
  textDocument?: { diagnostic?: unknown } & Record<string, unknown>;
  workspace?: { diagnostics?: unknown } & Record<string, unknown>;
}

/**
 * Removes the pull-diagnostics capability so the server pushes
 * (`textDocument/publishDiagnostics`). vscode-languageclient 9 pulls only
 * for documents shown in text tabs, so cells of a notebook would never be
 * pulled and never get diagnostics; pushed diagnostics reach cells and files
 * alike. The server chooses push or pull from these capabilities, never both.
 */
export function preferPushDiagnostics<T extends CapabilitiesLike>(capabilities: T): T {
  if (capabilities.textDocument) {
    delete capabilities.textDocument.diagnostic;
  }
  if (capabilities.workspace) {
    delete capabilities.workspace.diagnostics;
  }
  return capabilities;
}
