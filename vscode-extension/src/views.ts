// Read-only views of what the server knows: generated kernel source as a
// virtual document (`fuselens-kernel:`) and the HTML report in a webview.

import * as fs from "fs/promises";
import * as path from "path";
import * as vscode from "vscode";
import { makeNonce, withCsp } from "./logic/csp";
import { KERNEL_SCHEME, kernelArgsFromQuery, kernelChoices, kernelSourceText, kernelUriParts } from "./logic/kernelUri";
import { FuselensServer } from "./server";

/** Serves `fuselens-kernel:` documents from the server's `fuselens.kernelSource` command. */
export class KernelSourceProvider implements vscode.TextDocumentContentProvider {
  /** Language ids learned from the server, applied once the document is open. */
  readonly languages = new Map<string, string>();

  constructor(private readonly server: FuselensServer) {}

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const args = kernelArgsFromQuery(uri.query);
    const { text, language } = kernelSourceText(await this.server.executeCommand("fuselens.kernelSource", args));
    if (language) {
      this.languages.set(uri.toString(), language);
    }
    return text;
  }
}

/**
 * Opens a kernel of a code lens beside the code; a lens over several kernels
 * asks which one.
 */
export async function showKernelSource(provider: KernelSourceProvider, args: unknown[]): Promise<void> {
  const { uri: documentUri, names } = kernelChoices(args);
  if (!documentUri || names.length === 0) {
    throw new Error("use the code lens over a compiled function to pick a kernel");
  }
  const name =
    names.length === 1
      ? names[0]
      : await vscode.window.showQuickPick(names, { title: "FuseLens: generated kernels", placeHolder: "kernel to show" });
  if (!name) {
    return;
  }
  const { path: p, query } = kernelUriParts(documentUri, name);
  const uri = vscode.Uri.from({ scheme: KERNEL_SCHEME, path: p, query });
  let doc = await vscode.workspace.openTextDocument(uri);
  const language = provider.languages.get(uri.toString());
  if (language && doc.languageId !== language) {
    doc = await vscode.languages.setTextDocumentLanguage(doc, language);
  }
  await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preview: true });
}

let reportPanel: vscode.WebviewPanel | undefined;

/**
 * Shows an HTML report file in a webview (reused between calls). The report
 * is self-contained (inline CSS and SVG, no script): scripts stay off and a
 * strict Content-Security-Policy with a fresh nonce (logic/csp.ts) lets only
 * the report's own style sheet apply and nothing load.
 */
export async function showReportFile(file: string): Promise<vscode.WebviewPanel> {
  const html = withCsp(await fs.readFile(file, "utf8"), makeNonce());
  const title = `FuseLens: ${path.basename(file)}`;
  if (!reportPanel) {
    reportPanel = vscode.window.createWebviewPanel("fuselens.report", title, vscode.ViewColumn.Beside, {
      enableScripts: false,
      enableFindWidget: true,
      localResourceRoots: [],
      retainContextWhenHidden: true,
    });
    reportPanel.onDidDispose(() => {
      reportPanel = undefined;
    });
  }
  reportPanel.title = title;
  reportPanel.webview.html = html;
  reportPanel.reveal(vscode.ViewColumn.Beside, true);
  return reportPanel;
}
