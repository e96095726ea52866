// Lifecycle of the FuseLens language server: `<python> -m fuselens server`
// over stdio, started by the language client, restarted on demand, when
// settings change and when the workspace becomes trusted.

import * as vscode from "vscode";
import {
  ClientCapabilities,
  ExecuteCommandRequest,
  FeatureState,
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
  State,
  StaticFeature,
} from "vscode-languageclient/node";
import { preferPushDiagnostics } from "./logic/capabilities";
import { uriForServer } from "./logic/commandArgs";
import { chooseInterpreter, InterpreterChoice, serverCommandLine, startFailure } from "./logic/interpreter";
import { enforceTrust, initializationOptions, readSettings, FuselensSettings } from "./logic/settings";
import { trackServerProgress } from "./progress";
import { activePythonEnvironment } from "./pythonExtension";

export const SERVER_ID = "fuselens";
export const SERVER_NAME = "FuseLens";

/**
 * Python documents: files, unsaved buffers and the cells of notebooks (the
 * cell schemes, as ruff-vscode does, so the client syncs cells through the
 * server's notebookDocumentSync).
 */
const DOCUMENT_SELECTOR = [
  { scheme: "file", language: "python" },
  { scheme: "untitled", language: "python" },
  { scheme: "vscode-notebook", language: "python" },
  { scheme: "vscode-notebook-cell", language: "python" },
];

export type ServerListener = (event: "starting" | "running" | "stopped", detail?: string) => void;

export class FuselensServer implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private clientDisposables: vscode.Disposable[] = [];
  private queue: Promise<void> = Promise.resolve();
  private listeners: ServerListener[] = [];
  private notificationHandlers: [string, (params: unknown) => void][] = [];
  /** launchConfig() of the running server, as JSON. */
  private launched = "";
  interpreter: InterpreterChoice | undefined;
  settings: FuselensSettings | undefined;

  constructor(
    private readonly context: vscode.ExtensionContext,
    readonly output: vscode.LogOutputChannel,
  ) {}

  /** Called on start/stop transitions (the status bar listens). */
  onStateChange(listener: ServerListener): void {
    this.listeners.push(listener);
  }

  /** Registers a handler for a server notification on every (re)started client. */
  onNotification(method: string, handler: (params: unknown) => void): void {
    this.notificationHandlers.push([method, handler]);
    if (this.client) {
      this.clientDisposables.push(this.client.onNotification(method, handler));
    }
  }

  get running(): boolean {
    return this.client?.state === State.Running;
  }

  /** Starts or restarts; calls are serialised so quick successive restarts do not race. */
  restart(reason: string): Promise<void> {
    this.queue = this.queue.then(() => this.doRestart(reason)).catch(() => undefined);
    return this.queue;
  }

  stop(): Promise<void> {
    this.queue = this.queue.then(() => this.doStop()).catch(() => undefined);
    return this.queue;
  }

  /** Runs a server command (`workspace/executeCommand`), starting the server if needed. */
  async executeCommand(command: string, args: unknown[]): Promise<unknown> {
    if (!this.client) {
      await this.restart("a command needed the server");
    }
    await this.queue;
    if (!this.client || !this.running) {
      throw new Error("the FuseLens server is not running (see the FuseLens output)");
    }
    return this.client.sendRequest(ExecuteCommandRequest.type, { command, arguments: args });
  }

  /**
   * Restarts only when what the server would be started with changed (a
   * granted trust also "changes" restricted settings: that restart already
   * happened).
   */
  restartIfChanged(reason: string): Promise<void> {
    this.queue = this.queue
      .then(async () => {
        if (!this.client || JSON.stringify(await this.launchConfig()) !== this.launched) {
          await this.doRestart(reason);
        }
      })
      .catch(() => undefined);
    return this.queue;
  }

  /** Settings, interpreter and trust as a server start would read them now. */
  private async launchConfig() {
    const folder = vscode.workspace.workspaceFolders?.[0];
    const trusted = vscode.workspace.isTrusted;
    const config = vscode.workspace.getConfiguration("fuselens", folder?.uri);
    const settings = readSettings((key) => config.get(key));
    const interpreter = chooseInterpreter({
      setting: settings.interpreter,
      pythonExtension: await activePythonEnvironment(folder?.uri, this.output),
      trusted,
      workspaceFolders: (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath),
      platform: process.platform,
    });
    return { folder: folder?.uri.fsPath ?? "", trusted, settings, interpreter };
  }

  private async doRestart(reason: string): Promise<void> {
    await this.doStop();
    const launch = await this.launchConfig();
    this.launched = JSON.stringify(launch);
    const folder = vscode.workspace.workspaceFolders?.[0];
    const trusted = launch.trusted;
    this.settings = launch.settings;
    this.interpreter = launch.interpreter;
    const { command, args } = serverCommandLine(this.interpreter.command);
    this.output.info(`Starting server (${reason}): ${[command, ...args].join(" ")}`);
    this.output.info(`Interpreter from ${this.interpreter.source}; workspace trusted: ${trusted}`);
    if (this.interpreter.note) {
      this.output.info(this.interpreter.note);
    }
    this.emit("starting");

    // In a restricted window the server must not pick up a `fuselens` package
    // (or anything else importable) from the workspace: `python -m` puts the
    // working directory first on sys.path, so start it from the extension's
    // own folder and ask Python not to add the cwd (PYTHONSAFEPATH, 3.11+).
    const cwd = trusted && folder ? folder.uri.fsPath : this.context.extensionPath;
    const env: NodeJS.ProcessEnv = { ...process.env, PYTHONUNBUFFERED: "1" };
    if (!trusted) {
      env.PYTHONSAFEPATH = "1";
    }
    const serverOptions: ServerOptions = { command, args, options: { cwd, env } };
    const clientOptions: LanguageClientOptions = {
      documentSelector: DOCUMENT_SELECTOR,
      outputChannel: this.output,
      traceOutputChannel: this.output,
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      uriConverters: {
        code2Protocol: (uri) => uriForServer(uri.toString()),
        protocol2Code: (value) => vscode.Uri.parse(value),
      },
      initializationOptions: initializationOptions(this.settings, trusted, folder?.uri.fsPath ?? ""),
      // The server owns what happens; a crash loop should not spam restarts.
      connectionOptions: { maxRestartCount: 3 },
      middleware: {
        workspace: {
          // The server also reads `trusted` from the "fuselens" section; in
          // VS Code only workspace trust decides it, so a folder's own
          // settings.json cannot switch it on.
          configuration: async (params, token, next) => {
            const result = await next(params, token);
            if (!Array.isArray(result)) {
              return result;
            }
            return result.map((value, i) => enforceTrust(params.items[i]?.section, value, vscode.workspace.isTrusted));
          },
        },
      },
    };
    const client = new LanguageClient(SERVER_ID, SERVER_NAME, serverOptions, clientOptions);
    client.registerFeature(new PushDiagnostics());
    this.client = client;
    this.clientDisposables.push(
      client.onDidChangeState((e) => {
        if (e.newState === State.Stopped && this.client === client) {
          this.emit("stopped", "the server exited");
        }
      }),
    );
    for (const [method, handler] of this.notificationHandlers) {
      this.clientDisposables.push(client.onNotification(method, handler));
    }
    this.clientDisposables.push(trackServerProgress(client));
    try {
      await client.start();
      this.output.info(`Server running: ${client.initializeResult?.serverInfo?.name ?? SERVER_NAME} ${client.initializeResult?.serverInfo?.version ?? ""}`);
      this.emit("running");
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      this.output.error(`Server failed to start: ${message}`);
      const failure = startFailure(this.interpreter, trusted);
      this.emit("stopped", failure.actions["Manage Workspace Trust"] ? "waiting for workspace trust" : "failed to start");
      const show = failure.actions["Manage Workspace Trust"] ? vscode.window.showInformationMessage : vscode.window.showErrorMessage;
      void show(failure.message, ...Object.keys(failure.actions)).then((choice) => {
        if (choice === "Show Log") {
          this.output.show();
        } else if (choice === "Open Settings") {
          void vscode.commands.executeCommand("workbench.action.openSettings", "fuselens.interpreter");
        } else if (choice) {
          void vscode.commands.executeCommand(failure.actions[choice]);
        }
      });
      await this.doStop();
    }
  }

  private async doStop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    for (const d of this.clientDisposables.splice(0)) {
      d.dispose();
    }
    if (client) {
      try {
        // stop() sends shutdown/exit and kills the process after the timeout.
        await client.stop(2000);
      } catch (err) {
        this.output.warn(`Stopping the server: ${err instanceof Error ? err.message : String(err)}`);
      }
      this.emit("stopped");
    }
  }

  private emit(event: "starting" | "running" | "stopped", detail?: string): void {
    for (const l of this.listeners) {
      l(event, detail);
    }
  }

  dispose(): void {
    void this.stop();
  }
}

/**
 * Registered after the built-in features, so it edits the capabilities they
 * filled: see `preferPushDiagnostics` for why notebooks need push.
 */
class PushDiagnostics implements StaticFeature {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    preferPushDiagnostics(capabilities as Parameters<typeof preferPushDiagnostics>[0]);
  }
  initialize(): void {}
  getState(): FeatureState {
    return { kind: "static" };
  }
  clear(): void {}
}
