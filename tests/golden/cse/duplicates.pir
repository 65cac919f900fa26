// RUN: cse
// Repeated computations merge, and merging makes their users repeat in turn.
graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
  %a = add(%x, %y) : f32[4]
  %b = add(%x, %y) : f32[4]
  %c = exp(%a) : f32[4]
  %d = exp(%b) : f32[4]
  %e = mul(%c, %d) : f32[4]
  %f = mul(%d, %c) : f32[4]
  return %e, %f
}
// EXPECT:
graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
  %a = add(%x, %y) : f32[4]
  %c = exp(%a) : f32[4]
  %e = mul(%c, %c) : f32[4]
  return %e, %e
}
