// A small pre-norm transformer encoder block (one attention head, d_model 32, MLP 64) on a
// sequence of 8 tokens, written the way code generators and hand edits often leave graphs:
// with redundancies that the optimization passes remove. Each one is marked below with the
// pass that removes it. `partita demo` optimizes this file and checks that the outputs are
// unchanged; the weights are in block.safetensors (made by make_example.py).
graph @block(
    %x: f32[8,32],
    %ln1_w: f32[32] param, %ln1_b: f32[32] param,
    %wq: f32[32,32] param, %wk: f32[32,32] param, %wv: f32[32,32] param, %wo: f32[32,32] param,
    %ln2_w: f32[32] param, %ln2_b: f32[32] param,
    %w1: f32[32,64] param, %b1: f32[64] param, %w2: f32[64,32] param, %b2: f32[32] param
) -> (f32[8,32]) {
  // --- attention --------------------------------------------------------------------------
  // The norm is computed twice, once for the queries and once for the keys: cse merges them.
  %hq = layer_norm(%x, %ln1_w, %ln1_b) : f32[8,32]
  %hk = layer_norm(%x, %ln1_w, %ln1_b) : f32[8,32]
  %one = constant() {value=dense<f32[], 1.0>} : f32[]
  %hv = mul(%hq, %one) : f32[8,32]                       // x * 1: canonicalize
  %q = matmul(%hq, %wq) : f32[8,32]
  %k = matmul(%hk, %wk) : f32[8,32]
  %v = matmul(%hv, %wv) : f32[8,32]
  // A layout round trip: transpose(transpose(k)) is k (canonicalize), and the transpose
  // left after that duplicates %kt (cse).
  %kt = transpose(%k) : f32[32,8]
  %k_again = transpose(%kt) : f32[8,32]
  %kt2 = transpose(%k_again) : f32[32,8]
  %scores = matmul(%q, %kt2) : f32[8,8]
  // 1 / sqrt(d_model) computed at run time from constants: fold-constants.
  %d = constant() {value=dense<f32[], 32.0>} : f32[]
  %sqrt_d = sqrt(%d) : f32[]
  %scale = div(%one, %sqrt_d) : f32[]
  %scaled = mul(%scores, %scale) : f32[8,8]
  %p = softmax(%scaled) : f32[8,8]
  // Attention entropy, computed for logging and never returned: dce.
  %logp = log(%p) : f32[8,8]
  %plogp = mul(%p, %logp) : f32[8,8]
  %entropy = sum(%plogp) {axes=[1]} : f32[8]
  %attn = matmul(%p, %v) : f32[8,32]
  %o = matmul(%attn, %wo) : f32[8,32]
  %r1 = add(%x, %o) : f32[8,32]
  // --- MLP --------------------------------------------------------------------------------
  %g = layer_norm(%r1, %ln2_w, %ln2_b) : f32[8,32]
  %zeros = constant() {value=dense<f32[64], 0.0>} : f32[64]
  %bias1 = add(%b1, %zeros) : f32[64]                    // b + 0: canonicalize
  %u = matmul(%g, %w1) : f32[8,64]
  %u_b = add(%u, %bias1) : f32[8,64]
  %act = gelu(%u_b) {approximate="tanh"} : f32[8,64]
  %y = matmul(%act, %w2) : f32[8,32]
  %y_b = add(%y, %b2) : f32[8,32]
  // The residual written as r - (-y): canonicalize rewrites it to r + y.
  %neg_y = neg(%y_b) : f32[8,32]
  %out = sub(%r1, %neg_y) : f32[8,32]
  return %out
}
