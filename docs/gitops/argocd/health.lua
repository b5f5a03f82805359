-- Argo CD health check for bashtask.dev/BashTask: the value of
-- resource.customizations.health.bashtask.dev_BashTask in argocd-cm
-- (see docs/gitops.md). Tested by controllers/gitops_test.go against tasks
-- read back from a real API server at every phase.
local hs = {}

local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.observedGeneration == nil or
    (obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the task"
  return hs
end

local complete = condition("Complete")
if complete ~= nil and complete.status == "True" then
  hs.status = "Healthy"
  hs.message = complete.message
  return hs
end

local failed = condition("Failed")
if failed ~= nil and failed.status == "True" then
  hs.status = "Degraded"
  local message = failed.message or ""
  if string.sub(message, 1, #failed.reason) == failed.reason then
    hs.message = message
  else
    hs.message = failed.reason .. ": " .. message
  end
  return hs
end

-- suspend only holds a task back before dispatch; once dispatched it runs on.
if obj.spec ~= nil and obj.spec.suspend == true and obj.status.nodeName == nil then
  hs.status = "Suspended"
  hs.message = "spec.suspend is true; the task is not dispatched"
  return hs
end

hs.status = "Progressing"
local ready = condition("Ready")
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for the task to finish"
end
return hs
