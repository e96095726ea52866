// Entry point: wires the server, the status bar, the commands and the
// kernel document provider together, and maps workspace trust and settings
// changes onto server restarts.

import * as vscode from "vscode";
import { registerCommands } from "./commands";
import { KERNEL_SCHEME } from "./logic/kernelUri";
import { settingsChangeAction } from "./logic/settings";
import { onDidChangePythonInterpreter } from "./pythonExtension";
import { FuselensServer } from "./server";
import { StatusBar } from "./statusBar";
import { KernelSourceProvider } from "./views";

let server: FuselensServer | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("FuseLens", { log: true });
  const status = new StatusBar();
  server = new FuselensServer(context, output);
  const kernels = new KernelSourceProvider(server);
  context.subscriptions.push(output, status, server);
  context.subscriptions.push(vscode.workspace.registerTextDocumentContentProvider(KERNEL_SCHEME, kernels));

  server.onStateChange((event, detail) => {
    if (event === "starting") {
      status.set({ kind: "starting" });
    } else if (event === "running") {
      status.set(vscode.workspace.isTrusted ? { kind: "idle" } : { kind: "restricted" });
    } else {
      status.set({ kind: "stopped", reason: detail });
    }
  });
  // Optional server notifications; a server that sends neither still works
  // (the status bar then counts diagnostics).
  server.onNotification("fuselens/analysisStarted", (params) =>
    status.analysisStarted((params as { uri?: string } | undefined)?.uri),
  );
  server.onNotification("fuselens/analysisFinished", (params) => status.analysisFinished(params));
  // What the server does send: work-done progress around each analysis.
  server.onProgress({
    begin: (message) => status.set({ kind: "running", file: message?.replace(/^running\s+/, "") }),
    end: () => status.analysisFinished(undefined),
  });

  registerCommands(context, server, status, kernels);

  // Trust is an initialization option: a newly trusted window gets a fresh
  // server that may run the user's program.
  context.subscriptions.push(
    vscode.workspace.onDidGrantWorkspaceTrust(() => void server?.restart("workspace trusted")),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (settingsChangeAction((section) => e.affectsConfiguration(section)) === "restart") {
        void server?.restartIfChanged("settings changed");
      }
    }),
  );
  const pythonChange = await onDidChangePythonInterpreter(
    () => void server?.restartIfChanged("Python interpreter changed"),
    output,
  );
  if (pythonChange) {
    context.subscriptions.push(pythonChange);
  }

  await server.restart("activation");
}

export async function deactivate(): Promise<void> {
  await server?.stop();
  server = undefined;
}
