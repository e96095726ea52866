-- Headless Neovim 0.11 check of the README's fuselens recipe (loaded as the
-- user's init.lua before this file runs). Opens $FL_FILE, waits for the
-- server's spare worker, saves with :w and times diagnostics; with FL_RAPID=1
-- it then saves 20 times in quick succession, alternating two texts, and waits for the
-- diagnostics of the last one. Writes a JSON summary to $FL_OUT; `cquit 1` on
-- failure.
local file, out = os.getenv("FL_FILE"), os.getenv("FL_OUT")

local function fail(msg)
  io.stderr:write("nvim recipe check failed: " .. msg .. "\n")
  vim.cmd("cquit 1")
end

local function lines_of(diags)
  local got = {}
  for _, d in ipairs(diags) do table.insert(got, { line = d.lnum, code = d.code, source = d.source }) end
  return got
end

vim.cmd("edit " .. vim.fn.fnameescape(file))
local buf = vim.api.nvim_get_current_buf()
if not vim.wait(30000, function() return #vim.lsp.get_clients({ bufnr = buf, name = "fuselens" }) > 0 end, 50) then
  fail("the recipe attached no fuselens client to the buffer")
end
local client = vim.lsp.get_clients({ bufnr = buf, name = "fuselens" })[1]

local function server_info()
  local resp = client:request_sync("workspace/executeCommand", { command = "fuselens.serverInfo", arguments = {} }, 10000, buf)
  return resp and resp.result or {}
end
if not vim.wait(120000, function() return server_info().worker_warm == true end, 250) then
  fail("the server started no warm worker for the trusted folder")
end

local summary = { root_dir = client.root_dir }
local t0 = vim.uv.hrtime()
vim.cmd("write")
if not vim.wait(120000, function() return #vim.diagnostic.get(buf) > 0 end, 10) then
  fail("no diagnostics within 120 s of :w")
end
summary.save_to_diagnostics_s = (vim.uv.hrtime() - t0) / 1e9
summary.first = lines_of(vim.diagnostic.get(buf))

if os.getenv("FL_RAPID") ~= "1" then
  local f = io.open(out, "w")
  f:write(vim.fn.json_encode(summary))
  f:close()
  client:stop()
  vim.wait(3000, function() return client:is_stopped() end, 100)
  vim.cmd("qall!")
  return
end

-- 20 rapid saves; the last text has a comment line on top, so its recompile
-- sits one line lower: a stale result would show the old line.
local original = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
local shifted = vim.list_extend({ "# shifted" }, vim.deepcopy(original))
for i = 1, 20 do
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, (i % 2 == 0) and shifted or original)
  vim.cmd("silent write")
end
local want = 4
local function settled()
  local d = vim.diagnostic.get(buf)
  return #d == 1 and d[1].lnum == want
end
if not vim.wait(180000, settled, 50) then
  fail("after 20 saves the diagnostics are " .. vim.inspect(lines_of(vim.diagnostic.get(buf))))
end
vim.wait(3000, function() return false end, 100) -- a stale late result would land now
summary.after_saves = lines_of(vim.diagnostic.get(buf))

local f = io.open(out, "w")
f:write(vim.fn.json_encode(summary))
f:close()
client:stop()
vim.wait(3000, function() return client:is_stopped() end, 100)
vim.cmd("qall!")
