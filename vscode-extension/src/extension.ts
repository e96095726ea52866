// Entry point: wires the server, the status bar, the commands and the
// kernel document provider together, and maps workspace trust and settings
// changes onto server restarts.

import * as vscode from "vscode";
import { registerCommands } from "./commands";
import { KERNEL_SCHEME } from "./logic/kernelUri";
import { settingsChangeAction } from "./logic/settings";
import { ANALYSIS_FINISHED, ANALYSIS_STARTED, AnalysisFinishedParams, AnalysisStartedParams } from "./logic/status";
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
  // The server says when each analysis starts and finishes, with its counts
  // (its work-done progress is for showing, not for reading).
  server.onNotification(ANALYSIS_STARTED, (params) => status.analysisStarted((params as AnalysisStartedParams).uri));
  server.onNotification(ANALYSIS_FINISHED, (params) => status.analysisFinished(params as AnalysisFinishedParams));

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
