// RUN: cse
// Two train-mode dropouts draw two masks: never merged. Inference dropouts are pure and merge.
graph @f(%x: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {
  %0 = dropout(%x) {train=true, seed=1} : f32[8]
  %1 = dropout(%x) {train=true, seed=1} : f32[8]
  %2 = dropout(%x) : f32[8]
  %3 = dropout(%x) : f32[8]
  return %0, %1, %2, %3
}
// EXPECT:
graph @f(%x: f32[8]) -> (f32[8], f32[8], f32[8], f32[8]) {
  %0 = dropout(%x) {train=true, seed=1} : f32[8]
  %1 = dropout(%x) {train=true, seed=1} : f32[8]
  %2 = dropout(%x) : f32[8]
  return %0, %1, %2, %2
}
