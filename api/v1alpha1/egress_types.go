package v1alpha1

// Limits of the egress policy (docs/egress.md), enforced by the CRD
// schema and repeated here for clients and the agent.
const (
	// MaxEgressRules is the most entries spec.egress.allow and
	// spec.egress.deny each hold.
	MaxEgressRules = 64
	// MaxEgressPorts is the most ports one allow rule names.
	MaxEgressPorts = 16
	// MaxEgressDomainLength is the longest domain pattern in characters:
	// a DNS name's limit (RFC 1035), the "*." of a wildcard included.
	MaxEgressDomainLength = 253
	// MaxEgressInjections is the most entries spec.egress.inject holds.
	MaxEgressInjections = 16
	// MaxEgressHeaderValueBytes is the longest injected header value in
	// bytes: valuePrefix and the Secret key's value together.
	MaxEgressHeaderValueBytes = 8192
)

// EgressDomainPattern is the regular expression every domain of an egress
// rule matches (CEL validates it, the agent checks it again): a lower-case
// DNS name of letters, digits and hyphens (RFC 1123 labels of 1 to 63
// characters), optionally preceded by "*." for the name's subdomains.
const EgressDomainPattern = `^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`

// EgressPolicy limits the names tasks of network Egress reach
// (docs/egress.md): the agent's resolver answers only the names it
// allows, and connections go only to addresses an allowed name resolved
// to. It may change while a workspace lives: new connections follow the
// new policy within a second, open ones stay open.
//
// +kubebuilder:validation:XValidation:rule="!has(self.deny) || self.deny.all(r, !has(r.ports))",message="spec.egress.deny[].ports must be unset: a denied domain is denied on every port (ports narrow allow rules only)"
// +kubebuilder:validation:XValidation:rule="!has(self.inject) || !has(self.deny) || self.inject.all(i, !self.deny.exists(d, d.domain == i.domain || (d.domain.startsWith('*.') && i.domain.endsWith(d.domain.substring(1)))))",message="spec.egress.inject[].domain is denied by a spec.egress.deny rule: a header cannot be injected for a domain the policy denies"
// +kubebuilder:validation:XValidation:rule="!has(self.inject) || !(has(self.default) ? self.default == 'Deny' : (has(self.allow) && size(self.allow) > 0)) || self.inject.all(i, has(self.allow) && self.allow.exists(a, (a.domain == i.domain || (a.domain.startsWith('*.') && i.domain.endsWith(a.domain.substring(1)))) && (!has(a.ports) || 443 in a.ports)))",message="spec.egress.inject[].domain is not allowed on port 443 by a spec.egress.allow rule under a default of Deny: a header cannot be injected for a domain the policy denies"
type EgressPolicy struct {
	// default is what happens to a name neither list matches: Allow or
	// Deny. Unset: Deny when allow has entries, else Allow.
	// +optional
	Default *EgressDefault `json:"default,omitempty"`

	// allow lists the domains tasks may reach, at most 64. A name that
	// matches both lists is denied.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Allow []EgressRule `json:"allow,omitempty"`

	// deny lists the domains tasks may not reach, at most 64; a deny rule
	// wins over an allow rule and names no ports.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Deny []EgressRule `json:"deny,omitempty"`

	// inject lists credential injection rules, at most 16 (docs/egress.md):
	// HTTPS requests to a rule's domain go through the agent's
	// intercepting proxy, which adds the header with a value from a
	// Secret that the workspace's tasks never see. BashWorkspace only.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Inject []EgressInjection `json:"inject,omitempty"`
}

// EgressInjection attaches a header to the HTTPS requests of a
// workspace's tasks to a domain, at the agent's intercepting proxy.
type EgressInjection struct {
	// domain is a DNS name in lower case, exact or a wildcard, as in an
	// allow rule. The policy must let it be reached on port 443.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^(\\\\*\\\\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\\\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')",message="domain must be a lower-case DNS name such as example.com, or *. followed by one such as *.example.com (labels of letters, digits and hyphens, 1 to 63 characters each)"
	Domain string `json:"domain,omitempty"`

	// header is the header's name, an HTTP token (RFC 9110 section 5.1)
	// of at most 256 characters, such as Authorization. A header of that
	// name a task sends is replaced.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[-!#$%&\\x27*+.^_`|~0-9A-Za-z]+$')",message="header must be an HTTP header name: letters, digits and !#$%&'*+-.^_`|~ (an RFC 9110 token)"
	Header string `json:"header,omitempty"`

	// valuePrefix goes before the Secret key's value, such as "Bearer ".
	// At most 256 characters, no control characters.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^\x00-\x1f\x7f]*$`
	ValuePrefix *string `json:"valuePrefix,omitempty"`

	// secretKeyRef names the Secret key in the workspace's namespace whose
	// value the header gets. While the Secret or key does not exist the
	// workspace stays Pending with a condition that names them.
	// +required
	SecretKeyRef KeySelector `json:"secretKeyRef,omitzero"`

	// caBundle verifies the upstream server with the PEM certificates of
	// a Secret or ConfigMap key instead of the node's trust store.
	// +optional
	CABundle *ValueSource `json:"caBundle,omitempty"`

	// scrubResponses replaces the header's value in the responses'
	// headers and bodies with "[scrubbed by bashtask]", for a domain that
	// echoes requests back. Unset: false.
	// +optional
	ScrubResponses *bool `json:"scrubResponses,omitempty"`
}

// EgressDefault is what an egress policy does with a name no rule
// matches.
// +kubebuilder:validation:Enum=Allow;Deny
type EgressDefault string

const (
	// EgressDefaultAllow lets tasks reach any name no deny rule matches,
	// and any address (the policy then refuses names only).
	EgressDefaultAllow EgressDefault = "Allow"
	// EgressDefaultDeny lets tasks reach only names an allow rule matches,
	// and only the addresses those names resolved to.
	EgressDefaultDeny EgressDefault = "Deny"
)

// EgressRule matches domain names, and for an allow rule the ports
// connections to them may use.
type EgressRule struct {
	// domain is a DNS name in lower case, exact (example.com) or a
	// wildcard for its subdomains at any depth (*.example.com matches
	// a.example.com and a.b.example.com, not example.com). At most 253
	// characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^(\\\\*\\\\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\\\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$')",message="domain must be a lower-case DNS name such as example.com, or *. followed by one such as *.example.com (labels of letters, digits and hyphens, 1 to 63 characters each)"
	Domain string `json:"domain,omitempty"`

	// ports are the TCP and UDP destination ports an allow rule lets
	// through, 1 to 65535, at most 16. Unset: every port and protocol.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	Ports []int32 `json:"ports,omitempty"`
}

// ConditionEgressPolicy is a BashWorkspace condition: True once the
// workspace's agent enforces spec.egress of the condition's
// observedGeneration (reason EgressPolicyApplied), False when it refused
// it (reason InvalidSpec, the message names the rule).
const ConditionEgressPolicy = "EgressPolicy"

// ReasonEgressPolicyApplied is the reason of ConditionEgressPolicy when
// the agent enforces the policy.
const ReasonEgressPolicyApplied = "EgressPolicyApplied"
