-- Minimal test reporter shared by the Lua tests: each test prints
-- "ok - NAME" or "FAIL - NAME: WHY" and the file ends with "N passed, N failed".
local M = { passed = 0, failed = 0 }

-- Record one assertion; returns cond so callers can chain.
function M.ok(cond, name, why)
  if cond then
    M.passed = M.passed + 1
    if os.getenv("FD_VERBOSE") then print("ok - " .. name) end
  else
    M.failed = M.failed + 1
    print("FAIL - " .. name .. (why and (": " .. tostring(why)) or ""))
  end
  return cond
end

-- Assert that f(...) raises an error whose message matches pattern.
function M.raises(pattern, name, f, ...)
  local ok, err = pcall(f, ...)
  if ok then return M.ok(false, name, "no error raised") end
  return M.ok(tostring(err):find(pattern) ~= nil, name,
              ("error '%s' does not match '%s'"):format(tostring(err), pattern))
end

-- Assert equality with a readable difference.
function M.eq(got, want, name)
  return M.ok(got == want, name, ("got %s, want %s"):format(tostring(got), tostring(want)))
end

-- Print the closing line and exit non-zero on failure.
function M.done()
  print(("%d passed, %d failed"):format(M.passed, M.failed))
  os.exit(M.failed == 0 and 0 or 1)
end

return M
