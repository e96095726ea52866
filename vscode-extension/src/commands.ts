// Client-side commands. Server commands (`fuselens.analyze`,
// `fuselens.writeReport`, `fuselens.kernelSource`) are called through
// `workspace/executeCommand`; the language client also registers every
// command the server advertises, so client ids never reuse a server id.

import * as vscode from "vscode";
import { documentUriArg, isNotebookCellUri, reportFromResult } from "./logic/commandArgs";
import { commandLine, profilerArgv, shellKind } from "./logic/shell";
import { FuselensServer } from "./server";
import { StatusBar } from "./statusBar";
import { KernelSourceProvider, showKernelSource, showReportFile } from "./views";

export function registerCommands(
  context: vscode.ExtensionContext,
  server: FuselensServer,
  status: StatusBar,
  kernels: KernelSourceProvider,
): void {
  const register = (id: string, fn: (...args: unknown[]) => unknown) =>
    context.subscriptions.push(vscode.commands.registerCommand(id, fn));

  register("fuselens.analyzeFile", async (...args) => {
    const uri = targetUri(args);
    if (!uri) {
      return void vscode.window.showWarningMessage("FuseLens: open a Python file or notebook to analyse.");
    }
    if (!vscode.workspace.isTrusted) {
      return void vscode.window.showWarningMessage("FuseLens runs your program to analyse it: trust this folder first.");
    }
    status.analysisStarted(uri);
    let result: unknown;
    try {
      // {force: true}: the user asked for a fresh run, not the cached one.
      result = await server.executeCommand("fuselens.analyze", [uri, { force: true }]);
      const answer = result as { status?: string; message?: string } | null;
      if (answer?.status === "untrusted") {
        void vscode.window.showWarningMessage("FuseLens: the server treats this folder as untrusted; nothing ran.");
      } else if (answer?.status === "error") {
        reportError("Analysis failed", answer.message ?? "unknown error");
      }
    } catch (err) {
      reportError("Analysis failed", err);
    } finally {
      status.analyzeAnswered(result, uri);
    }
  });

  register("fuselens.showReport", async (...args) => {
    const uri = targetUri(args);
    if (!uri) {
      return void vscode.window.showWarningMessage("FuseLens: open an analysed Python file or notebook first.");
    }
    try {
      const report = reportFromResult(await server.executeCommand("fuselens.writeReport", [uri]));
      if (report.format === "html") {
        await showReportFile(report.path);
      } else {
        // The server falls back to JSON when it cannot render HTML.
        const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(report.path));
        await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preview: true });
      }
    } catch (err) {
      reportError("No report", err);
    }
  });

  register("fuselens.showKernelSource", async (...args) => {
    try {
      await showKernelSource(kernels, args);
    } catch (err) {
      reportError("Cannot show the kernel", err);
    }
  });

  register("fuselens.openProfiler", async (...args) => {
    if (!vscode.workspace.isTrusted) {
      return void vscode.window.showWarningMessage("The FuseLens profiler runs your program: trust this folder first.");
    }
    const uri = targetUri(args);
    if (!uri || !uri.startsWith("file:")) {
      return void vscode.window.showWarningMessage("FuseLens: open a saved Python file or notebook to profile.");
    }
    const file = vscode.Uri.parse(uri).fsPath;
    const interpreter = server.interpreter?.command ?? ["python3"];
    const folder = vscode.workspace.getWorkspaceFolder(vscode.Uri.parse(uri));
    const terminal = vscode.window.createTerminal({ name: "FuseLens profiler", cwd: folder?.uri.fsPath });
    const kind = shellKind(vscode.env.shell, process.platform);
    terminal.show();
    terminal.sendText(commandLine(profilerArgv(interpreter, file), kind), true);
  });

  register("fuselens.restartServer", () => server.restart("restart command"));
  register("fuselens.stopServer", () => server.stop());
  register("fuselens.showOutput", () => server.output.show());
}

/**
 * The document a command is about: from code lens arguments, else the active
 * notebook or editor. Notebook cells resolve to their notebook file.
 */
function targetUri(args: unknown[]): string | undefined {
  const fromArgs = documentUriArg(args);
  const uri = fromArgs ?? activeUri();
  if (uri && isNotebookCellUri(uri)) {
    const cell = vscode.Uri.parse(uri);
    const notebook = vscode.workspace.notebookDocuments.find((nb) =>
      nb.getCells().some((c) => c.document.uri.toString() === cell.toString()),
    );
    return notebook?.uri.toString() ?? uri;
  }
  return uri;
}

function activeUri(): string | undefined {
  const notebook = vscode.window.activeNotebookEditor?.notebook;
  if (notebook) {
    return notebook.uri.toString();
  }
  return vscode.window.activeTextEditor?.document.uri.toString();
}

function reportError(what: string, err: unknown): void {
  const message = err instanceof Error ? err.message : String(err);
  void vscode.window.showErrorMessage(`FuseLens: ${what}: ${message}`);
}
